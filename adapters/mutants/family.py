"""The bug zoo of the reference, registered as a family (pyproject.toml): `mutant-<slug>`."""

from kvspec.conformance.families import Family

FAMILY = Family(prefix="mutant-", implementation="reference", members_at="kvspec.adapters.mutants:MUTANTS")
