"""TokenSpeed's seeded bugs as a family of the bug zoo: `tokenspeed-mutant-<slug>`.

Each member is the `tokenspeed` adapter on TokenSpeed 0.1.42 built from its sdist with
kvspec's seeded bugs (builds.py, bugs.py), one bug switched on. Looking a member up makes
the patched build this process's `tokenspeed_scheduler` (builds.activate) before the
harness starts its forkserver, whose preload (build_preload) then activates it for every
worker; the worker switches the member's bug on right before it builds each scheduler.

`admission-refuses-exact-fit` is in the build but not in the zoo: within
`max_new_tokens` TokenSpeed preempts only in a plan that runs nothing, so the bug mostly
delays an admission, which chapter 10 does not forbid; SCHED-7 saw it in one ci run of two
(bugs.py).
"""

from functools import partial

from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.harness.families import Family, PreparedMembers

from . import TOKENSPEED, make_scheduler
from .bugs import BUGS, SeededBug, select
from .builds import INSTALL_COMMAND, activate

LEFT_OUT = {"admission-refuses-exact-fit": "chapter 10 sees it only rarely (SCHED-7 in one ci run of two): "
                                           "within max_new_tokens it only delays an admission"}
EXPOSED_BY = Run(4, 7, scheduler=True)
"""Every seeded bug shows at P = 4, W = 7. (`decode-skips-window-release` needs W not a
multiple of P: otherwise each decode that expires a page also needs a new one, and the path
that needs one releases; measured caught at P=2 W=5, P=4 W=7, P=16 W=5, passed at P=4 W=8.)"""


def make_seeded(config, slug: str):
    select(slug)  # read by the Scheduler's constructor, in this (worker) process
    return make_scheduler(config)


def member(bug: SeededBug) -> type:
    return type(f"TOKENSPEED_{bug.slug.replace('-', '_').upper()}", (TOKENSPEED,), {
        "__doc__": f"{bug.breaks}\n\nSeeded at {bug.site}: {bug.change}. After: {bug.analogy}",
        "name": f"tokenspeed-mutant-{bug.slug}", "clause": bug.clause, "invariant_class": bug.invariant_class,
        "exposed_by": EXPOSED_BY,
        "preload": ("kvspec.adapters.tokenspeed.build_preload", TOKENSPEED.preload),
        "make_scheduler": staticmethod(partial(make_seeded, slug=bug.slug))})


MEMBERS = PreparedMembers({bug.slug: member(bug) for bug in BUGS if bug.slug not in LEFT_OUT},
                          lambda adapter: activate())
"""Looking a member up activates the patched build in this process."""
FAMILY = Family(prefix="tokenspeed-mutant-", implementation="tokenspeed", shown_as="TokenSpeed's patched build",
                members_at="kvspec.adapters.tokenspeed.family:MEMBERS", left_out_at="kvspec.adapters.tokenspeed.family:LEFT_OUT",
                install=INSTALL_COMMAND, installed_at="kvspec.adapters.tokenspeed.builds:installed")
