"""Imported by the forkserver before it forks workers: the activated release's imports,
once. The forkserver does not yet have the parent's `sys.path` (release_shelf.py)."""

import os

from ..runtime import vllm
from .environment import ACTIVE, activate

activate(os.environ[ACTIVE])
vllm()
