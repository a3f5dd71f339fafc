"""The configuration reference, generated from the config tables (`tollhouse config reference`,
committed as docs/config-reference.md; tests/docs/test_config_reference.py fails when the two
differ).

`keys()` walks `Config` the way proxy.config.load builds it and yields one `Key` per TOML key,
named by its path: `server.listen`, `upstreams[].access.tools_deny` (`[]`: each table of an
array), `upstreams[].placeholders.<name>.claim` (`<name>`: a key the file chooses). A key's
type and default come from the dataclass field, its allowed values from a `Literal` type or,
for a string the section checks restrict, from `CHOICES`; what it does is the comment written
on the field in its class: the comment lines right above it and the comment at the end of its
line(s). A field without one is listed with an empty description (`undocumented()` names them).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import sys
import tokenize
import typing
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config.audit_exports import EXPORT_FORMATS, EXPORT_KINDS
from proxy.config.guardrails import GUARDRAIL_DETECT
from proxy.config.observability import LOG_FORMATS
from proxy.config.rates import RATE_LIMIT_KEYS
from proxy.config.tables import Config
from proxy.config.zones import COLLECTION_POLICIES, ZONES

_HEADING = re.compile(r"^(#{1,2}) +(.+?) *#*$")
DOCS_DIR = Path(__file__).resolve().parents[2] / "docs"
COMMAND = "tollhouse config reference > docs/config-reference.md"

# the words a string key takes, where its section's check (proxy.config.<section>) restricts
# it and its type does not say so; tests/docs/test_config_reference.py checks that each such
# key refuses any other word. An array's entries, or a table's values, are each one of them.
CHOICES: Mapping[str, tuple[str, ...]] = {
    "server.event_loop": ("asyncio", "uvloop"),
    "auth.mode": ("none", "jwt"),
    "auth.issuers[].algorithms": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                  "ES256", "ES384", "ES512", "EdDSA", "HS256", "HS384",
                                  "HS512"),
    "database.audit_journal": ("auto", "on", "off"),
    "upstreams[].transport": ("http", "stdio"),
    "upstreams[].auth": ("static", "per_user"),
    "upstreams[].era": ("auto", "legacy", "modern"),
    "upstreams[].identity": ("none", "headers", "jwt"),
    "upstreams[].process": ("shared", "per_user"),
    "upstreams[].zones": ZONES,
    "upstreams[].screening.mode": ("off", "warn", "hide"),
    "upstreams[].pinning.mode": ("off", "warn", "approve"),
    "rate_limits[].key": RATE_LIMIT_KEYS,
    "metering.on_error": ("deny", "allow"),
    "egress.collections": COLLECTION_POLICIES,
    "observability.log_format": LOG_FORMATS,
    "guardrails[].on": ("arguments", "results"),
    "guardrails[].detect": GUARDRAIL_DETECT,
    "guardrails[].action": ("redact", "deny", "audit"),
    "audit.exports[].kind": EXPORT_KINDS,
    "audit.exports[].format": EXPORT_FORMATS,
}

# which part of the docs explains a key: the longest path prefix listed here, a page of docs/
# and the slug of one of its headings (`#` and no slug: the page). A page not written yet gives
# the next shorter prefix's link, and a heading the page no longer has the page's, rather than
# a broken link.
PAGES: Mapping[str, str] = {
    "server": "operations.md#",
    "server.max_response_bytes": "operations.md#large-answers",
    "server.shutdown_grace_s": "operations.md#signals-drain-and-reload",
    "server.sse_heartbeat_s": "operations.md#streams-through-proxies",
    "server.trusted_proxies": "upstreams.md#egress",
    "server.connect_link_ttl_s": "per-user.md#the-connect-prompt-as-a-url-elicitation",
    "server.workers": "deployment.md#several-replicas",
    "server.event_loop": "performance.md#",
    "server.gc_freeze": "performance.md#",
    "server.gc_threshold": "performance.md#",
    "server.gc_sweep_s": "performance.md#",
    "auth": "identity.md#",
    "auth.oidc": "identity.md#sign-in-and-the-oauth-server",
    "oauth_server": "identity.md#sign-in-and-the-oauth-server",
    "oauth_server.clients": "identity.md#machine-clients",
    "oauth_server.enterprise_idps": "provisioning.md#enterprise-managed-authorization",
    "database": "deployment.md#database",
    "state": "deployment.md#several-replicas",
    "upstreams": "upstreams.md#",
    "upstreams[].era": "upstreams.md#two-protocol-eras-on-one-endpoint",
    "upstreams[].zones": "upstreams.md#egress",
    "upstreams[].collections": "upstreams.md#egress",
    "upstreams[].access": "identity.md#",
    "upstreams[].auth": "per-user.md#",
    "upstreams[].oauth": "per-user.md#",
    "upstreams[].screening": "guardrails.md#",
    "upstreams[].pinning": "guardrails.md#",
    "upstreams[].placeholders": "per-caller-and-stdio.md#per-caller-upstream-servers",
    "upstreams[].max_resolved": "per-caller-and-stdio.md#per-caller-upstream-servers",
    **{f"upstreams[].{key}": "per-caller-and-stdio.md#local-upstreams-stdio-servers"
       for key in ("transport", "command", "args", "env", "cwd", "process", "max_processes",
                   "idle_stop_s", "start_timeout_s", "token_env", "run_as", "memory_limit_mb",
                   "open_files_limit", "cpu_limit_s", "max_line_bytes")},
    "endpoints": "virtual-endpoints.md#",
    "rate_limits": "identity.md#",
    "metering": "metering.md#",
    "egress": "upstreams.md#egress",
    "observability": "operations.md#",
    "observability.metrics": "operations.md#metrics",
    "observability.metrics_token": "operations.md#metrics",
    "observability.metrics_public": "operations.md#metrics",
    "observability.otlp_endpoint": "operations.md#traces",
    "observability.service_name": "operations.md#traces",
    "observability.log_format": "operations.md#logs",
    "guardrails": "guardrails.md#",
    "console": "console.md#",
    "policy": "policies.md#",
    "approvals": "approvals.md#",
    "approvals_webhook": "approvals.md#the-approvals-webhook",
    "audit.exports": "audit-export.md#",
    "audit.retention_days": "audit-evidence.md#retention",
    "audit.chain": "audit-evidence.md#the-hash-chain-one-per-writer",
}


@dataclass(frozen=True)
class Key:
    """One key of the file (or one table, `kind` "table" or "array of tables")."""

    path: str
    kind: str
    default: str
    choices: tuple[str, ...]
    doc: str

    @property
    def section(self) -> str:
        return self.path.split(".")[0].removesuffix("[]")

    @property
    def table(self) -> bool:
        return self.kind in ("table", "array of tables", "table of tables")


def keys(cls: type[Any] = Config, prefix: str = "") -> Iterator[Key]:
    """Every key under `cls`, in the order of its fields, each table before its keys."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        path, tp, doc = f"{prefix}{f.name}", hints[f.name], docs.get(f.name, "")
        table, kind, below = nested(tp)
        if table is None:
            yield Key(path, _kind(tp), _default(f), _choices(path, tp), doc)
        else:
            yield Key(path, kind, "", (), _table_doc(doc, table))
            yield from keys(table, f"{path}{below}")


def nested(tp: Any) -> tuple[Any, str, str]:
    """For a type whose values are tables: (their dataclass, the key's kind, what its keys'
    paths add after its own); (None, "", "") for any other."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return tp, "table", "."
    if origin is list and dataclasses.is_dataclass(args[0]):
        return args[0], "array of tables", "[]."
    if origin is dict and dataclasses.is_dataclass(args[1]):
        return args[1], "table of tables", ".<name>."
    return None, "", ""


def undocumented() -> list[str]:
    """The keys (tables included) whose field carries no comment."""
    return [k.path for k in keys() if not k.doc]


def render(docs_dir: Path = DOCS_DIR) -> str:
    """The Markdown reference: one section per top-level key, a row per key."""
    out = [
        "# Configuration reference",
        "",
        f"<!-- generated by `{COMMAND}` from proxy/config/tables.py: do not edit -->",
        "",
        ("Every key of the TOML config file, generated from the config types "
         "(`proxy/config/tables.py`): its type, its default, the values it allows, what it "
         "does and where the guides explain it. `[]` in a path stands for each table of an "
         "array (`[[upstreams]]`), `<name>` for a key the file chooses. A `${VAR}` inside any "
         "string is replaced from the environment. `config.example.toml` shows every key."),
    ]
    section = ""
    for key in keys():
        if key.section != section:
            section = key.section
            out += ["", f"## `{_header(key)}`", "",
                    "| Key | Type | Default | Allowed values | What it does | Explained in |",
                    "| --- | --- | --- | --- | --- | --- |"]
        out.append(_row(key, link(key.path, docs_dir)))
    return "\n".join(out) + "\n"


def link(path: str, docs_dir: Path = DOCS_DIR) -> str:
    """A Markdown link to the part of the docs that explains the key at `path`; "" when no
    page listed for it is written yet."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        target = PAGES.get(prefix, PAGES.get(prefix.removesuffix("[]")))
        if target is None:
            continue
        page, _, slug = target.partition("#")
        headings = _headings(docs_dir / page)
        if not headings:
            continue
        if slug and slug in headings:
            return f"[{headings['']} › {headings[slug]}]({page}#{slug})"
        return f"[{headings['']}]({page})"
    return ""


def _headings(page: Path) -> dict[str, str]:
    """A page's `##`-level headings by their slug (MkDocs' default), its title under ""; {}
    when the page does not exist."""
    if not page.is_file():
        return {}
    found: dict[str, str] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            level, text = match.groups()
            found.setdefault("" if level == "#" else _slug(text), text)
    found.setdefault("", page.stem)
    return found


def _slug(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Each field's comment in the class's source: the comment lines right above the field
    and the comments on its own line(s), joined into one line. Read with `tokenize` alone:
    `ast` (and `inspect.getsource`, which parses the module) can fail on CPython 3.11 with
    "AST constructor recursion depth mismatch" while another thread compiles."""
    lines = _class_lines(cls)
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    starts: list[tuple[int, str]] = []  # (line, field) of each `name: type` at the body's level
    depth = 0
    line_start = True
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
            continue
        if tok.type in (tokenize.NL, tokenize.NEWLINE):
            line_start = tok.type == tokenize.NEWLINE or line_start
            continue
        if tok.type in (tokenize.INDENT, tokenize.DEDENT):
            continue
        code_lines.add(tok.start[0])
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        if line_start and depth == 0 and tok.type == tokenize.NAME and tok.start[1] == 4:
            starts.append((tok.start[0], tok.string))
        line_start = False
    fields = {name for name in getattr(cls, "__dataclass_fields__", {})}
    ends = [line for line, _ in starts[1:]] + [len(lines) + 1]
    docs: dict[str, str] = {}
    for (line, name), following in zip(starts, ends, strict=True):
        if name not in fields:
            continue
        above: list[str] = []
        n = line - 1
        while n in comments and n not in code_lines:
            above.insert(0, comments[n])
            n -= 1
        end = max((c for c in code_lines if line <= c < following), default=line)
        after = [comments[k] for k in range(line, end + 1) if k in comments]
        docs[name] = " ".join(above + after)
    return docs


def _class_lines(cls: type[Any]) -> list[str]:
    """The source lines of `cls` (dedented to the class's own column), found by reading its
    module's file: the `class` line and every line after it that is blank, a comment or
    indented deeper."""
    path = sys.modules[cls.__module__].__file__
    assert path is not None
    source = Path(path).read_text(encoding="utf-8").splitlines(keepends=True)
    head = re.compile(rf"^(\s*)class {re.escape(cls.__name__)}\b")
    for i, text in enumerate(source):
        found = head.match(text)
        if found is None:
            continue
        indent = len(found.group(1))
        out = [text[indent:]]
        for rest in source[i + 1:]:
            if rest.strip() and len(rest) - len(rest.lstrip()) <= indent:
                break
            out.append(rest[indent:] if len(rest) > indent else rest.lstrip(" "))
        while out and not out[-1].strip():
            out.pop()
        return out
    raise ValueError(f"class {cls.__name__} not found in {path}")


def _table_doc(comment: str, cls: Any) -> str:
    """A table's description: its class's docstring, else the comment on its field."""
    doc = inspect.getdoc(cls) or ""
    if doc == inspect.getdoc(object) or doc.startswith(f"{cls.__name__}("):
        doc = ""  # the dataclass's generated signature, not a description
    return " ".join(doc.split()) or comment


def _kind(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return _kind(type(args[0]))
    if origin in (list, tuple):
        return f"array of {_kind(args[0])}s"
    if origin is dict:
        return f"table of {_kind(args[1])}s"
    names: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names[tp]


def _choices(path: str, tp: Any) -> tuple[str, ...]:
    if typing.get_origin(tp) is typing.Literal:
        return tuple(map(str, typing.get_args(tp)))
    return tuple(CHOICES.get(path, ()))


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return toml_value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return toml_value(f.default_factory())
    return "required"


def toml_value(value: Any) -> str:
    """`value` as the file would write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _header(key: Key) -> str:
    if key.kind == "array of tables":
        return f"[[{key.path}]]"
    if key.table:
        return f"[{key.path}]"
    return key.path


def _row(key: Key, docs: str) -> str:
    default = f"`{key.default}`" if key.default and key.default != "required" else key.default
    choices = ", ".join(f"`{c}`" for c in key.choices)
    cells = (f"`{key.path}`", key.kind, default, choices, _text(key.doc), docs)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _text(comment: str) -> str:
    """A comment as Markdown text: `<this>` shown, not taken for HTML, and `*` for itself
    (code spans, between backticks, as they are)."""
    parts = comment.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts)
