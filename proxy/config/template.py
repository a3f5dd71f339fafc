"""A per-caller upstream URL: `https://{tenant}.mcp.internal/mcp`, each `{name}` filled from who
the caller is (`{subject}`, a token claim, else a person's attribute).

A URL built from caller data is an SSRF primitive unless every value is constrained, so the
template is checked once, at config load: placeholders may stand in the host, the port or the
path, never the scheme, the userinfo, the query or the fragment. A value must match its anchored
`pattern` (ASCII only: `re.ASCII`, so `\\w` is no door for a look-alike letter), and lands
encoded for where it lands: in the host, only letters, digits and `-` (one label, lowercased),
so no value adds a dot, an `@` or a port; in the port, digits 1-65535; in the path, percent-
encoded whole (`/`, `%`, `?` and `#` among them), and never a `.` or `..` segment. Anything
else is "no upstream for this caller", and nothing is dialled. The URL a value makes is checked
by the egress rules like any configured upstream's (proxy.upstream.tenants).

The template is a value of the config language (an upstream's `url`), so it lives here, below
the upstream client and the connect flow that fill it: the check at load and every later parse
are the same code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, urlsplit

DEFAULT_PATTERN = "[a-z0-9-]{1,63}"
SUBJECT = "subject"  # always filled from the caller's subject

Part = Literal["host", "port", "path"]
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_URL = re.compile(r"^(?P<scheme>[^:/?#{}]+)://(?P<authority>[^/?#]*)(?P<path>[^?#]*)"
                  r"(?P<rest>[?#].*)?$", re.DOTALL)
_HOST_VALUE = re.compile(r"[A-Za-z0-9-]{1,63}", re.ASCII)
_HOST_LITERAL = re.compile(r"[A-Za-z0-9.-]*", re.ASCII)
_PORT_VALUE = re.compile(r"[0-9]{1,5}", re.ASCII)


@dataclass(frozen=True, slots=True)
class Placeholder:
    """Where one placeholder's value comes from and what it must look like."""

    name: str
    claim: str  # the token claim read first
    attribute: str  # the person's attribute read when the token has no such claim
    pattern: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class Missing:
    """Why a caller has no upstream: the placeholder, and `absent` or `invalid`."""

    placeholder: str
    why: Literal["absent", "invalid"]

    @property
    def reason(self) -> str:
        """The audit record's reason (never the value: it is the caller's data)."""
        return f"no_upstream_for_caller: {self.why} {self.placeholder}"


@dataclass(frozen=True, slots=True)
class UrlTemplate:
    """A URL split once into literal text and placeholders, each tagged with its part."""

    text: str
    pieces: tuple[str | tuple[str, Part], ...]
    placeholders: Mapping[str, Placeholder]

    @property
    def needs_attributes(self) -> bool:
        return any(p.attribute for n, p in self.placeholders.items() if n != SUBJECT)

    @classmethod
    def parse(cls, url: str, declared: Mapping[str, tuple[str, str, str]]) -> UrlTemplate:
        """`declared`: name -> (claim, attribute, pattern). Raise ValueError, one line."""
        if "{" in url.partition(":")[0]:
            raise ValueError("a placeholder may not stand in the scheme")
        match = _URL.match(url)
        if match is None or match["scheme"] not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL with a host")
        if _PLACEHOLDER.search(match["rest"] or "") or "{" in (match["rest"] or ""):
            raise ValueError("a placeholder may stand only in the host, port or path")
        userinfo, at, hostport = match["authority"].rpartition("@")
        if at and ("{" in userinfo or "}" in userinfo):
            raise ValueError("a placeholder may not stand in the userinfo")
        if hostport.startswith("["):
            if "{" in hostport.partition("]")[0]:
                raise ValueError("a placeholder may not stand in an IPv6 address")
            host, port = hostport.partition("]")[0] + "]", hostport.partition("]")[2]
            port = port.removeprefix(":") if port.startswith(":") else port
            if port and not port.startswith("{") and not port.isdigit():
                raise ValueError("has an invalid port")
        else:
            host, _, port = hostport.partition(":")
        pieces: list[str | tuple[str, Part]] = [f"{match['scheme']}://"]
        if at:
            pieces.append(f"{userinfo}@")
        used: set[str] = set()
        pieces.extend(_split(host, "host", used))
        if not host:
            raise ValueError("must name a host")
        if port:
            pieces.append(":")
            if _PLACEHOLDER.search(port):
                if not _PLACEHOLDER.fullmatch(port):
                    raise ValueError("a port placeholder must be the whole port")
            elif not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("has an invalid port")
            pieces.extend(_split(port, "port", used))
        pieces.extend(_split(match["path"], "path", used))
        if match["rest"]:
            pieces.append(match["rest"])
        if not used:
            raise ValueError("has no {placeholder}")
        unused = sorted(set(declared) - used)
        if unused:
            raise ValueError(f"declares placeholder '{unused[0]}', which the URL does not use")
        placeholders: dict[str, Placeholder] = {}
        for name in sorted(used):
            if name not in declared and name != SUBJECT:
                raise ValueError(f"uses {{{name}}}, which [upstreams.placeholders] does not "
                                 "declare")
            claim, attribute, pattern = declared.get(name, ("", "", DEFAULT_PATTERN))
            try:
                compiled = re.compile(pattern, re.ASCII)
            except re.error as exc:
                raise ValueError(f"placeholder '{name}': pattern is not a regular expression "
                                 f"({exc})") from None
            placeholders[name] = Placeholder(name, claim or name, attribute or claim or name,
                                             compiled)
        literal = "".join(p for p in pieces if isinstance(p, str))
        try:
            urlsplit(literal).port  # noqa: B018 - the literal parts alone must parse
        except ValueError:
            raise ValueError("is not a valid URL") from None
        for piece in _split(host, "host", set()):
            if isinstance(piece, str) and not _HOST_LITERAL.fullmatch(piece):
                raise ValueError("a host with placeholders may hold only letters, digits, "
                                 "'-' and '.'")
        return cls(url, tuple(pieces), placeholders)

    def fill(self, values: Mapping[str, str | None]) -> str | Missing:
        """The URL for one caller's values, or why there is none."""
        out: list[str] = []
        for piece in self.pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            name, part = piece
            value = values.get(name)
            if value is None or value == "":
                return Missing(name, "absent")
            encoded = self._encode(self.placeholders[name], value, part)
            if encoded is None:
                return Missing(name, "invalid")
            out.append(encoded)
        return "".join(out)

    @staticmethod
    def _encode(placeholder: Placeholder, value: str, part: Part) -> str | None:
        if not value.isascii() or not placeholder.pattern.fullmatch(value):
            return None
        if part == "host":
            return value.lower() if _HOST_VALUE.fullmatch(value) else None
        if part == "port":
            if not _PORT_VALUE.fullmatch(value) or not 0 < int(value) < 65536:
                return None
            return str(int(value))
        if value.strip(".") == "":  # a dot segment would move the path
            return None
        return quote(value, safe="")


def _split(text: str, part: Part, used: set[str]) -> list[str | tuple[str, Part]]:
    out: list[str | tuple[str, Part]] = []
    at = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > at:
            out.append(text[at:match.start()])
        out.append((match[1], part))
        used.add(match[1])
        at = match.end()
    if at < len(text):
        out.append(text[at:])
    for piece in out:
        if isinstance(piece, str) and ("{" in piece or "}" in piece):
            raise ValueError("has an unmatched '{' or '}', or a placeholder name that is not "
                             "letters, digits and '_'")
    return out
