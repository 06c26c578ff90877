"""Imported by the forkserver before it forks workers: the activated release's imports,
once. The forkserver does not yet have the parent's `sys.path` (environment.py)."""

import os

from ..runtime import sglang
from .environment import ACTIVE, activate

activate(os.environ[ACTIVE])
sglang()
