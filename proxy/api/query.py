"""Query-string parsing for the audit, usage and list routes: a period, a page size, an
offset and a cursor.
Each parser adds what is wrong to a list of problems (one 422 lists them all)."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

Problems = list[dict[str, Any]]
# A Unix time in a query: a plain decimal number (no exponent, sign +, _, or other digits)
DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
MAX_LIMIT = 500
MAX_ROW_ID = 2**63 - 1  # a row id either database can hold


def period(args: Mapping[str, str], problems: Problems) -> dict[str, float | None]:
    """`since` and `until`, each a finite plain decimal Unix time if given, `since` not after
    `until`; every problem is added to `problems`."""
    times: dict[str, float | None] = {"since": None, "until": None}
    for key in times:
        value = args.get(key)
        if value is None:
            continue
        number = float(value) if DECIMAL.fullmatch(value) else math.nan
        if math.isfinite(number):
            times[key] = number
        else:
            problems.append({"loc": ["query", key], "msg": "must be a Unix time: a plain "
                             "decimal number such as 1700000000.5", "type": "float_parsing"})
    since, until = times["since"], times["until"]
    if since is not None and until is not None and since > until:
        problems.append({"loc": ["query", "since"], "msg": "must not be after until",
                         "type": "value_error"})
    return times


def limit(value: str | None, problems: Problems) -> int:
    """A page size: ASCII digits, 1 to MAX_LIMIT (50 if not given)."""
    if value is None:
        return 50
    if re.fullmatch(r"[0-9]{1,3}", value) and 1 <= int(value) <= MAX_LIMIT:
        return int(value)
    problems.append({"loc": ["query", "limit"], "msg": f"must be a whole number from 1 to "
                     f"{MAX_LIMIT}", "type": "value_error"})
    return 50


def offset(value: str | None, problems: Problems) -> int:
    """How many rows a page skips: ASCII digits, 0 to 999,999,999 (0 if not given)."""
    if value is None:
        return 0
    if re.fullmatch(r"[0-9]{1,9}", value):
        return int(value)
    problems.append({"loc": ["query", "offset"], "msg": "must be a whole number from 0",
                     "type": "value_error"})
    return 0


def cursor(value: str | None, problems: Problems) -> tuple[float, int] | None:
    """A cursor this API gave: [ts, id], a finite float time and a row id 0..2**63-1."""
    if not value:
        return None
    try:
        decoded = orjson.loads(base64.urlsafe_b64decode(value.encode() + b"=="))
    except (ValueError, orjson.JSONDecodeError):
        decoded = None
    if isinstance(decoded, list) and len(decoded) == 2:
        ts, row_id = decoded
        if type(ts) is float and math.isfinite(ts) and type(row_id) is int \
                and 0 <= row_id <= MAX_ROW_ID:
            return ts, row_id
    problems.append({"loc": ["query", "cursor"], "msg": "not a cursor this API gave",
                     "type": "value_error"})
    return None


def encode_cursor(row: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([row["ts"], row["id"]])).rstrip(b"=").decode()
