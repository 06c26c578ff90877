"""Imported by the forkserver before it forks workers: vLLM's imports, once."""

from .runtime import vllm

vllm()
