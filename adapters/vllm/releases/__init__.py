"""The `vllm@` family: every vLLM release with the hybrid KV cache manager (catalog.py)."""
