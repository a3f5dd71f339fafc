"""A call's arguments as Cedar values (the JSON form `context.input` takes), guided by the
input type the schema declared for the tool (policies.cedar.schema).

Strings, booleans and integers map directly; an integer outside Cedar's 64-bit Long, and a
number where the schema says `number` (Cedar `decimal`) that decimal cannot hold exactly (more
than four fractional digits, or beyond its range), raise `Unrepresentable`, which the decider
turns into a refusal naming the argument (never its value): rounding could move a value across
a policy's bound. Objects become records, arrays sets. A JSON null, and an argument the schema
does not declare, are left out (a policy cannot name an undeclared argument; a missing required
one is an evaluation error, and evaluation errors refuse).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DECIMAL_MAX = Decimal("922337203685477.5807")
_DECIMAL_MIN = Decimal("-922337203685477.5808")
_FOUR = Decimal("0.0001")


class Unrepresentable(ValueError):
    """An argument Cedar cannot hold as its declared type; the message names the argument's
    path, never its value."""


def cedar_input(args: Mapping[str, Any], record: Mapping[str, Any] | None) -> dict[str, Any]:
    """`args` as the JSON value of `context.input`; `record` is the declared Cedar record type
    (None: the tool was not seen, every argument is converted by its JSON type)."""
    return _record(args, record, "input")


def _record(value: Mapping[str, Any], record: Mapping[str, Any] | None,
            where: str) -> dict[str, Any]:
    attrs = record.get("attributes") if record is not None else None
    out: dict[str, Any] = {}
    for name, item in value.items():
        if item is None:
            continue
        if attrs is not None:
            if name not in attrs:
                continue
            out[name] = _value(item, attrs[name], f"{where}.{name}")
        else:
            out[name] = _value(item, None, f"{where}.{name}")
    return out


def _value(item: Any, declared: Mapping[str, Any] | None, where: str) -> Any:
    kind = declared.get("type") if declared is not None else None
    if kind == "Extension" or (kind is None and isinstance(item, float)):
        return _decimal(item, where)
    if isinstance(item, (bool, str)):
        return item
    if isinstance(item, int):
        if not _LONG_MIN <= item <= _LONG_MAX:
            raise Unrepresentable(f"argument {where} is outside Cedar's Long range")
        return item
    if isinstance(item, float):  # declared Long: a whole float is still an integer
        if item.is_integer():
            return _value(int(item), declared, where)
        return item  # a type mismatch: evaluation errors, and the call is refused
    if isinstance(item, Mapping):
        return _record(item, declared if kind == "Record" else None, where)
    if isinstance(item, list):
        element = declared.get("element") if kind == "Set" and declared is not None else None
        return [_value(v, element, f"{where}[]") for v in item if v is not None]
    raise Unrepresentable(f"argument {where} has a type Cedar cannot hold")


def _decimal(item: Any, where: str) -> Any:
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        return item  # a type mismatch: evaluation errors, and the call is refused
    try:
        exact = Decimal(item) if isinstance(item, int) else Decimal(repr(item))
    except InvalidOperation:  # pragma: no cover - repr of a float always parses
        raise Unrepresentable(f"argument {where} is not a number Cedar can hold") from None
    if not exact.is_finite() or not _DECIMAL_MIN <= exact <= _DECIMAL_MAX or (
            exact.quantize(_FOUR) != exact):
        raise Unrepresentable(
            f"argument {where} needs more than Cedar decimal's four fractional digits or range")
    return {"__extn": {"fn": "decimal", "arg": f"{exact.quantize(_FOUR):f}"}}
