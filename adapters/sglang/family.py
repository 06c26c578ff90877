"""SGLang's bug zoo, registered as a family (pyproject.toml): `sglang-mutant-<slug>`."""

from kvspec.conformance.harness.families import Family

FAMILY = Family(prefix="sglang-mutant-", implementation="sglang", shown_as="real SGLang", members_at="kvspec.adapters.sglang.mutants:MUTANTS",
                requires="sglang", install="pip install --no-deps -r adapters/sglang/requirements.txt",
                left_out_at="kvspec.adapters.sglang.mutants:NOT_PATCHED")
