"""What drives an implementation and checks it: the adapter protocol and what packages register,
the checks, the drivers and state machines, traces and their replay, worker isolation."""
