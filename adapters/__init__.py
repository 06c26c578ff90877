"""kvspec.adapters: implementations under test, each behind the adapter protocol of
kvspec.conformance. `reference` is kvspec's own model."""
