"""config.example.toml against the config types: every key it shows exists, and every key that
exists appears in it (issue 46).

What counts as shown, in the file's own style:

- a table header, `[server]`, `[[upstreams]]`, or one commented out, `# [[endpoints]]`, starts
  the table its keys belong to (`[upstreams.oauth]` after `[[upstreams]]`: each upstream's
  `oauth`; a name under a table of tables, `[upstreams.access.group_tools.eng]`: any name);
- a key line, `key = value`, or one commented out at the start of the line, `# key = value`,
  shows `key` in the current table; an inline table's keys (`tenant = { claim = ... }`) are
  shown too;
- an alternative to the key above it, written as a comment `# or key = value` inside that
  key's own comment, shows `key` too (the issuer's `public_key_pem` and `hs256_secret`).

Every other comment is prose, and a key named only there does not count.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

from proxy.config.reference import keys, nested
from proxy.config.tables import Config

EXAMPLE = Path(__file__).parents[2] / "config.example.toml"

_HEADER = re.compile(r"^(?:#\s*)?(\[\[?)\s*([A-Za-z0-9_.]+)\s*\]\]?(?:\s*#.*)?$")
_KEY = re.compile(r"^(?:#\s?)?([a-z_][a-z0-9_]*)\s*=\s*(\S.*)$")
_ALTERNATIVE = re.compile(r"^#[#\s]*#\s*or\s+([a-z_][a-z0-9_]*)\s*=")


@dataclasses.dataclass
class _Table:
    """Where the lines below a header put their keys."""

    path: str  # "upstreams[].oauth"; "" for the file's top level
    cls: type[Any] | None  # the dataclass its keys are fields of; None: names the file chooses
    item: Any = None  # with cls None: the type of each named value


def shown(text: str) -> tuple[set[str], list[str]]:
    """The key paths `text` shows, and the lines that show a key or table that does not
    exist."""
    found: set[str] = set()
    faults: list[str] = []
    table = _Table("", Config)
    last_key = ""
    for number, line in enumerate(text.splitlines(), 1):
        if header := _HEADER.match(line):
            resolved = _resolve(header.group(2), header.group(1) == "[[")
            if resolved is None:
                faults.append(f"line {number}: no table [{header.group(2)}]: {line.strip()}")
                table = _Table("?", None)
            else:
                table = resolved
                if table.cls is None:
                    found.add(table.path)
            last_key = ""
            continue
        if table.path == "?":
            continue
        if key := _KEY.match(line):
            last_key = key.group(1)
            faults += [f"line {number}: {p}: {line.strip()}"
                       for p in _keys_of(table, key.group(1), key.group(2), found)]
        elif (alternative := _ALTERNATIVE.match(line)) and last_key:
            faults += [f"line {number}: {p}: {line.strip()}"
                       for p in _keys_of(table, alternative.group(1), None, found)]
    return found, faults


def _resolve(name: str, array: bool) -> _Table | None:
    table = _Table("", Config)
    for segment in name.split("."):
        if table.cls is None:  # a name of a table of tables
            if not dataclasses.is_dataclass(table.item):
                return None
            table = _Table(f"{table.path}.<name>", table.item)
            continue
        hints = typing.get_type_hints(table.cls)
        if segment not in hints:
            return None
        tp = hints[segment]
        path = f"{table.path}.{segment}".lstrip(".")
        cls, kind, _ = nested(tp)
        if kind == "table":
            table = _Table(path, cls)
        elif kind == "array of tables":
            table = _Table(f"{path}[]", cls)
        elif kind == "table of tables" or typing.get_origin(tp) is dict:
            table = _Table(path, None, cls or typing.get_args(tp)[1])
        else:
            return None
    if array != table.path.endswith("[]"):
        return None  # [[x]] for a table, or [x] for an array of tables
    return table


def _keys_of(table: _Table, key: str, value: str | None, found: set[str]) -> list[str]:
    """Add what `key = value` shows in `table` to `found`; return what does not exist."""
    if table.cls is None:  # a name the file chooses: its value may be an inline table
        if dataclasses.is_dataclass(table.item):
            return _inline(table.item, f"{table.path}.<name>", value, found)
        return []
    fields = {f.name: f for f in dataclasses.fields(table.cls)}
    path = f"{table.path}.{key}".lstrip(".")
    if key not in fields:
        return [f"no key {path}"]
    found.add(path)
    tp = typing.get_type_hints(table.cls)[key]
    if typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
        return [f"{path} is a table of tables: show it as [{path}.<name>]"]
    return []


def _inline(cls: type[Any], path: str, value: str | None, found: set[str]) -> list[str]:
    try:
        parsed = tomllib.loads(f"v = {value}")["v"] if value else None
    except tomllib.TOMLDecodeError:
        return []
    if not isinstance(parsed, dict):
        return []
    faults: list[str] = []
    for name in parsed:
        faults += _keys_of(_Table(path, cls), name, None, found)
    return faults


def test_every_key_the_example_shows_exists() -> None:
    _, faults = shown(EXAMPLE.read_text(encoding="utf-8"))
    assert not faults, "config.example.toml shows keys the config does not have:\n" + "\n".join(
        faults)


def _fields(cls: type[Any] = Config, prefix: str = "") -> dict[str, tuple[str, str]]:
    """Each key path (tables' too) and the (class, field) it is: `AccessConfig`'s fields are
    the keys of both `upstreams[].access` and `endpoints[].access`."""
    out: dict[str, tuple[str, str]] = {}
    for name, tp in typing.get_type_hints(cls).items():
        path = f"{prefix}{name}"
        out[path] = (cls.__name__, name)
        table, _, below = nested(tp)
        if table is not None:
            out |= _fields(table, f"{path}{below}")
    return out


def test_every_key_that_exists_appears_in_the_example() -> None:
    """Once per table type: the example shows [upstreams.access] whole and says that
    [endpoints.access] is the same table."""
    found, _ = shown(EXAMPLE.read_text(encoding="utf-8"))
    fields = _fields()
    seen = {fields[path] for path in found}
    missing = [k.path for k in keys() if not k.table and fields[k.path] not in seen]
    assert not missing, ("config.example.toml does not show these keys (add each, with its "
                         "default, in its table's style):\n" + "\n".join(missing))


def test_the_convention_reads_commented_keys_alternatives_and_inline_tables() -> None:
    found, faults = shown("""
[server]
listen = "x"                  # prose: max_sessions = 3 is not shown
# [[auth.issuers]]
# issuer = "i"
# jwks_url = "u"
#                             # or public_key_pem = "k" (a file)
# [upstreams.placeholders]
# t = { claim = "c", pattern = "p" }
# [egress.collections]
# customers = "lan"
""")
    assert not faults
    assert found == {"server.listen", "auth.issuers[].issuer", "auth.issuers[].jwks_url",
                     "auth.issuers[].public_key_pem", "upstreams[].placeholders",
                     "upstreams[].placeholders.<name>.claim",
                     "upstreams[].placeholders.<name>.pattern", "egress.collections"}


def test_a_stale_key_or_table_is_named() -> None:
    _, faults = shown("""
[server]
# lisen = "x"
[[upstream]]
name = "u"
[upstreams.placeholders]
t = { claim = "c", colour = "p" }
""")
    assert [f.split(":")[0] for f in faults] == ["line 3", "line 4", "line 7"]
    assert "no key server.lisen" in faults[0]
    assert "upstreams[].placeholders.<name>.colour" in faults[2]
