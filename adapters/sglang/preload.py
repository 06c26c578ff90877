"""Imported by the forkserver before it forks workers: SGLang's imports, once."""

from .runtime import sglang

sglang()
