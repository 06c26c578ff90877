"""The bug zoo of the reference, registered as a family (pyproject.toml): `mutant-<slug>`."""

from kvspec.conformance.harness.families import Family

FAMILY = Family(prefix="mutant-", implementation="reference", shown_as="the reference", members_at="kvspec.adapters.mutants:MUTANTS")
