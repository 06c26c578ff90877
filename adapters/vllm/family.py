"""vLLM's bug zoo, registered as a family (pyproject.toml): `vllm-mutant-<slug>`."""

from kvspec.conformance.harness.families import Family

FAMILY = Family(prefix="vllm-mutant-", implementation="vllm", shown_as="real vLLM", members_at="kvspec.adapters.vllm.mutants:ALL_MUTANTS",
                requires="vllm", install="pip install --no-deps -r adapters/vllm/requirements.txt")
