"""Checks shared by every config dataclass: unknown keys, value types, ranges and choices.

Each check returns problem strings ("key: what is wrong") instead of raising, so a
caller can collect every problem of a file or a pipeline and raise one `ValueError`
that lists them all, prefixed with where they were found (file, stage).
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

# A constraint looks at a value that already has the right type and returns a problem
# (without the key) or None. None values skip constraints: `X | None` fields allow None.
Constraint = Callable[[Any], "str | None"]


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like `word` (a likely typo fix), or None if nothing is close."""
    matches = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key(key: str, valid: Iterable[str], what: str = "key") -> str:
    """`unknown key 'max_num_seq'; did you mean 'max_num_seqs'?` (or the list of valid keys)."""
    valid = sorted(valid)
    guess = closest(key, valid)
    if guess is not None:
        return f"unknown {what} {key!r}; did you mean {guess!r}?"
    return f"unknown {what} {key!r}; valid: {', '.join(valid)}"


def one_of(*choices: str) -> Constraint:
    def check(value: Any) -> str | None:
        if value in choices:
            return None
        hint = closest(value, choices) if isinstance(value, str) else None
        suffix = f"; did you mean {hint!r}?" if hint else ""
        return f"{value!r} is not one of {'|'.join(choices)}{suffix}"

    return check


def at_least(minimum: float) -> Constraint:
    def check(value: Any) -> str | None:
        return None if value >= minimum else f"must be >= {minimum}, got {value!r}"

    return check


@cache
def _field_types(cls: type) -> dict[str, Any]:
    # Annotations are strings (`from __future__ import annotations`); resolve them once.
    return typing.get_type_hints(cls)


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass: field name -> type."""
    return dict(_field_types(cls))


def convert(value: Any, tp: Any) -> Any:
    """Return `value` as type `tp`, or raise TypeError with a readable expected type.

    The only conversions are the lossless ones YAML and JSON need: a list where a tuple
    is declared, and an int where a float is declared. Everything else must match.
    """
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert(value, arg)
            except TypeError:
                pass
        raise TypeError(f"expected {type_name(tp)}, got {_describe(value)}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected {type_name(tp)}, got {_describe(value)}")
        item = args[0] if args else Any
        return tuple(_convert_item(v, item, tp, f"item {i}") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected {type_name(tp)}, got {_describe(value)}")
        key_tp, val_tp = args if args else (Any, Any)
        return {
            _convert_item(k, key_tp, tp, f"key {k!r}"): _convert_item(v, val_tp, tp, f"{k!r}")
            for k, v in value.items()
        }
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is an int subclass; `max_num_seqs: true` is a mistake, not 1.
    if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise TypeError(f"expected {type_name(tp)}, got {_describe(value)}")


def _convert_item(value: Any, tp: Any, container: Any, where: str) -> Any:
    try:
        return convert(value, tp)
    except TypeError as e:
        raise TypeError(f"expected {type_name(container)}; {where}: {e}") from None


def type_name(tp: Any) -> str:
    """A type as a user would say it: "int", "str or null", "list of str"."""
    if tp is Any:
        return "any value"
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is tuple:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict or tp is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}" if args else "mapping"
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(tp.__name__, tp.__name__)


def _describe(value: Any) -> str:
    return f"{type_name(type(value))} {value!r}" if not isinstance(value, Mapping) else "a mapping"


def check_fields(
    cls: type, values: Mapping[str, Any], constraints: Mapping[str, Constraint]
) -> tuple[dict[str, Any], list[str]]:
    """Check `values` against the fields of dataclass `cls`.

    Returns (converted values, problems). Each problem names the key and what is wrong;
    an unknown key names the closest valid one.
    """
    types_ = _field_types(cls)
    converted: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in values.items():
        if key not in types_:
            problems.append(unknown_key(key, types_))
            continue
        try:
            value = convert(value, types_[key])
        except TypeError as e:
            problems.append(f"{key}: {e}")
            continue
        constraint = constraints.get(key)
        problem = constraint(value) if constraint is not None and value is not None else None
        if problem:
            problems.append(f"{key}: {problem}")
            continue
        converted[key] = value
    return converted, problems


def format_problems(title: str, problems: Iterable[str]) -> str:
    """One message for one `ValueError`: a title line, then one indented line per problem."""
    return title + "".join(f"\n  - {p}" for p in problems)
