"""[OBS-1] Whether a snapshot has the shape its dataclass declares, field by field.

A check reads a snapshot as the spec's types declare it; an implementation that returns
a field of another type (a string for a length, None for the tree's nodes) makes the
check itself raise, deep inside the spec's code. The checks do not pay for a type check
at every step: only when a check raises is the snapshot examined (checks.Checks), so the
failure names the field that is wrong, as a failure of the implementation.
"""

import dataclasses
import numbers
import re
import types
import typing
from collections.abc import Sequence
from functools import cache
from typing import Any

MAX_PROBLEM = 200
"""Longest repr of a wrong value kept in the message."""


@cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def shape_problem(value: Any, annotation: Any = None, where: str | None = None) -> str | None:
    """The first field of `value` whose value is not of its declared type, in words
    (`TwoPoolSnapshot.requests[0].seq_len is a str ('many'), not an int`), or None.
    Without `annotation`, `value` (a dataclass instance) is checked against its own
    class. Annotations this does not know (a Protocol, a callable) are accepted."""
    if annotation is None:
        annotation = type(value)
    if where is None:
        where = type(value).__name__
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        problems = [shape_problem(value, option, where) for option in arguments]
        if all(problems):
            return next((p for p, option in zip(problems, arguments) if option is not type(None)
                         and not p.endswith(f"not {described(option)}")), None) or wrong(value, annotation, where)
        return None
    if annotation is Any:
        return None
    if annotation is type(None):
        return None if value is None else wrong(value, annotation, where)
    if annotation is bool:
        return None if isinstance(value, (bool, numbers.Integral)) else wrong(value, annotation, where)
    if annotation is int:
        return None if isinstance(value, numbers.Integral) else wrong(value, annotation, where)
    if annotation is float:
        return None if isinstance(value, numbers.Real) else wrong(value, annotation, where)
    if annotation is str:
        return None if isinstance(value, str) else wrong(value, annotation, where)
    if origin in (tuple, Sequence) or annotation in (tuple, Sequence):
        if not isinstance(value, (tuple, list)) and not (origin is Sequence and isinstance(value, Sequence)):
            return wrong(value, annotation, where)
        if isinstance(value, dict):
            return None  # a partial mapping [OBS-4]: a dict by its entries
        item = arguments[0] if arguments and (len(arguments) == 1 or arguments[-1] is Ellipsis) else None
        if item is not None:
            for index, element in enumerate(value):
                if problem := shape_problem(element, item, f"{where}[{index}]"):
                    return problem
        return None
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if not isinstance(value, annotation):
            return wrong(value, annotation, where)
        for field in dataclasses.fields(annotation):
            declared = hints(annotation).get(field.name, Any)
            if problem := shape_problem(getattr(value, field.name, None), declared, f"{where}.{field.name}"):
                return problem
        return None
    return None


def described(annotation: Any) -> str:
    """A type in words: `an int`, `a PoolState`, `tuple[NodeView, ...]`, `None`."""
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        name = annotation.__name__
        return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"
    return re.sub(r"\b(?:[a-z_]+\.)+", "", str(annotation))  # without module paths


def wrong(value: Any, annotation: Any, where: str) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= MAX_PROBLEM else shown[:MAX_PROBLEM] + "..."
    return f"{where} is {'None' if value is None else f'{described(type(value))} ({shown})'}, " \
           f"not {described(annotation)}"


def plain(value: Any) -> Any:
    """`value` with every integer of another type (numpy's np.int64: any numbers.Integral
    but bool) an int, in the tuples, lists and dicts it holds; `value` itself where it holds
    none. The observables a driver hands on (free counts, request lengths: what a trace's
    `expect` records and a replay compares) are read through this, so that a trace can be
    written as JSON and a difference reads `expected 13, observed 12`, never
    `np.int64(12)`. A whole snapshot is not: a walk of it costs more than taking it
    (measured 150-900 us a step); checks.plain_numbers writes a failure's message plainly."""
    kind = type(value)
    if kind is int or kind is str or kind is bool or kind is float or value is None:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if kind is tuple or kind is list:
        return kind(plain(item) for item in value)
    if kind is dict:
        return {plain(key): plain(item) for key, item in value.items()}
    return value
