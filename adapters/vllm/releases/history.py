"""vLLM's release history: `kvspec check` of every member of the `vllm@` family (each release,
each prefix-cache retention it has), one process per member, sharded
(kvspec.conformance.runs.history):

    python -m kvspec.adapters.vllm.releases history --profile ci --out DIR [--shard I/N] [--members PREFIX ...]

writes `DIR/history[-I-of-N].json`, each member's report and traces beside it. A cell's own
columns: the member, its release, its retention (None: dense) and policy version.
"""

from pathlib import Path

from kvspec.conformance.runs.history import Member
from kvspec.conformance.runs.history import history as run_history

from .catalog import MEMBERS, key
from .environment import SHELF

SCHEMA = "kvspec-vllm-history/1"


def chosen(prefixes: list[str] | None) -> list[str]:
    """Members by release, then name; those whose name starts with one of `prefixes`."""
    names = sorted((f"vllm@{slug}" for slug in MEMBERS.members),
                   key=lambda name: (key(MEMBERS.members[name.removeprefix("vllm@")].release), name))
    return [name for name in names if not prefixes or any(name.startswith(prefix) for prefix in prefixes)]


def member(name: str) -> Member:
    adapter = MEMBERS.members[name.removeprefix("vllm@")]
    return Member(name, dict(member=name, release=adapter.release, retention=adapter.retention,
                             policy_version=adapter.policy_version), SHELF.installed(adapter.release))


def history(profile: str, out: Path, shard_spec: str | None, members: list[str] | None, workers: int,
            shrink_seconds: float | None = None, seed: int | None = None) -> Path:
    return run_history(map(member, chosen(members)), SCHEMA, profile, out, shard_spec, workers, shrink_seconds,
                       seed=seed)
