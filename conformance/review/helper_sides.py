"""The two sides `crosshair diffbehavior` compares for one pair (helper_pairs.py), built in
its subprocess: the spec's helper and the adapter's, each called only on inputs that meet
the spec helper's PEP 316 preconditions (its `pre:` lines). diffbehavior itself ignores
preconditions, and outside them the spec says nothing, so there both sides return the
same marker: an adapter may raise or return anything there.
"""

import ast
import inspect
import typing
from collections.abc import Callable
from typing import Any

from .helper_pairs import import_target, spec_helpers

PRECONDITION_NOT_MET = "<outside the spec helper's preconditions: not compared>"
"""What both sides return for an input the spec helper's preconditions exclude."""


def preconditions(function: Callable) -> list[str]:
    """The `pre:` expressions of a PEP 316 docstring, one per line."""
    lines = (line.strip() for line in (function.__doc__ or "").splitlines())
    return [line[len("pre:"):].strip() for line in lines if line.startswith("pre:")]


def conjuncts(expressions: list[str]) -> list[str]:
    """The preconditions as a list of single comparisons: `a and b` and `a <= b <= c`
    split into their parts (the same condition, for the pure expressions of a contract)."""
    parts = []

    def split(node: ast.expr) -> None:
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for value in node.values:
                split(value)
        elif isinstance(node, ast.Compare) and len(node.ops) > 1:
            operands = [node.left, *node.comparators]
            for left, op, right in zip(operands, node.ops, operands[1:]):
                parts.append(ast.unparse(ast.Compare(left, [op], [right])))
        else:
            parts.append(ast.unparse(node))

    for expression in expressions:
        split(ast.parse(expression, mode="eval").body)
    return parts


def prefer_true(condition: Any) -> bool:
    """A precondition's truth, with CrossHair told to try to make it hold: left to its
    usual branch choices, a search that must satisfy a dozen comparisons at once (a
    frontier's page alignments, its policy version) almost never gets past them. This is
    what `crosshair check` does with each `pre:` line; here each comparison gets it."""
    try:
        from crosshair.statespace import prefer_true as crosshair_prefer_true
        from crosshair.tracers import NoTracing, is_tracing
    except ImportError:  # another CrossHair: it explores as it will
        return bool(condition)
    if not is_tracing():  # called outside an analysis
        return bool(condition)
    with NoTracing():
        return bool(crosshair_prefer_true(condition))


def paired(helper: str, target: str) -> tuple[Callable, Callable]:
    """Two functions with the spec helper's signature: the spec's helper and the adapter's,
    each called only on inputs that meet the spec helper's preconditions. CrossHair reads
    their signatures to make symbolic arguments."""
    spec_function = spec_helpers()[helper]
    adapter_function = import_target(target)
    signature = inspect.signature(spec_function)
    conditions = [compile(text, f"<precondition of {helper}>", "eval")
                  for text in conjuncts(preconditions(spec_function))]
    spec_globals = spec_function.__globals__
    names = list(signature.parameters)

    def in_domain(args: tuple, kwargs: dict) -> dict | None:
        if kwargs or len(args) != len(names):  # CrossHair passes every argument by position
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = tuple(bound.arguments.values())
        arguments = dict(zip(names, args))
        for condition in conditions:
            try:
                met = prefer_true(eval(condition, spec_globals, dict(arguments)))
            except (ArithmeticError, TypeError, ValueError):  # one that cannot be evaluated is not met
                met = False
            if not met:
                return None
        return arguments

    def spec(*args, **kwargs):
        arguments = in_domain(args, kwargs)
        if arguments is None:
            return PRECONDITION_NOT_MET
        spec.inputs_compared += 1
        return spec_function(*arguments.values())

    def adapter(*args, **kwargs):
        arguments = in_domain(args, kwargs)
        return PRECONDITION_NOT_MET if arguments is None else adapter_function(*arguments.values())

    annotations = typing.get_type_hints(spec_function)
    for side in (spec, adapter):
        side.__signature__ = signature
        side.__annotations__ = dict(annotations)
    spec.inputs_compared = 0  # a search that never got inside the preconditions compared nothing
    return spec, adapter
