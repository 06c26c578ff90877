"""The bug zoo: the reference with one realistic bug seeded in each, a line or a few, as
adapters, to show that the conformance suite catches what it claims to catch.

    kvspec check --adapter mutant-frontier-into-window --profile ci
    kvspec zoo          # every mutant, each on the run that exposes it

must fail and name the mutant's clause. A mutant is an adapter like
kvspec.adapters.reference.ADAPTER with more attributes: `clause`, the spec clause the bug
breaks; `invariant_class`, that clause's class (kvspec.spec.invariants); `exposed_by`,
the conformance run that shows it; `reverts`, the upstream SGLang fix it undoes, if any.
`MUTANTS` maps each mutant's slug to it; its name is `mutant-<slug>`; each is also an
attribute of this package, for `--adapter kvspec.adapters.mutants:NAME`.

The bugs are grouped by where they live: seeding.py says how a bug is seeded; window.py
(window eviction), release.py (the request lifecycle), allocator.py (the two pools and
the mapping), tree.py (the prefix tree), state.py (recurrent state), one module each;
block_pool.py seeds the shared block pool of chapter 08 (a mutant per BLOCK clause).
"""

from . import allocator, block_pool, release, scheduler, state, tree, window  # noqa: F401 - importing a module registers its mutants
from .seeding import MUTANTS, Mutant

__all__ = ["MUTANTS", "Mutant"]

# each mutant is also an attribute of the package, for --adapter kvspec.adapters.mutants:NAME
globals().update({mutant.__name__: mutant for mutant in MUTANTS.values()})
