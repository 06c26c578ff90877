"""A forkserver preload for an adapter that drives TokenSpeed's patched build (builds.py):
listed before kvspec.adapters.tokenspeed.runtime, it makes the build that
KVSPEC_TOKENSPEED_BUILD names the `tokenspeed_scheduler` every worker imports. The
forkserver preloads before it takes the parent's `sys.path`, so the parent's activate()
reaches it only through that variable. Without the variable it does nothing."""

from .builds import activate_from_environment

activate_from_environment()
