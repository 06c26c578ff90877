"""kvspec.conformance: drives any implementation through an adapter and checks it
against the spec's invariants. Imports only kvspec.spec: the reference is just one
adapter among others."""
