"""`tollhouse policy check | test | explain | schema`: the Cedar policies (`[policy]`, issue 37)
checked, tested and explained like code, offline.

The schema is generated from the tools as last seen, read from the database
(proxy.seen_targets): the tools of each upstream's last tools/list with their hints and
argument schemas (`server_tools`; a pinned definition, `tool_pins`, takes precedence), the
person attribute names (`users`). A tool whose schema was over proxy.seen.MAX_SCHEMA has no
known arguments. `--tools
FILE` (JSON: `{"<endpoint>": [tool, ...]}` or `{"<endpoint>": {"tools": [...], "prompts":
[...]}}`, tools as tools/list gives them) names the tools instead, for CI without a database.

Exit status: 0 all good; 1 a test case that did not get what it expected; 2 a config or policy
problem (one line naming the file, the policy and the problem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from policies.cedar import (
    Call,
    Caller,
    Catalog,
    Policies,
    Policy,
    PolicyError,
    Target,
    could_permit,
    read_policies,
    validate,
)
from proxy.config import Config, ConfigError, load

_METHODS = {"tool": "tools/call", "prompt": "prompts/get", "resource": "resources/read"}


def command(args: argparse.Namespace) -> int:
    """Run `args.policy_command`; a ConfigError propagates (exit 2 in cli.main)."""
    commands = {"check": check, "test": test, "explain": explain, "schema": schema}
    return commands[args.policy_command](args)


def check(args: argparse.Namespace) -> int:
    compiled = _compiled(args)
    if compiled is None:
        return 2
    count = len(compiled.policies)
    shadow = sum(p.mode == "shadow" for p in compiled.policies)
    print(f"policy: {count} policies valid ({shadow} shadow) against "
          f"{len(compiled.catalog.targets)} tools and prompts")
    return 0


def test(args: argparse.Namespace) -> int:
    compiled = _compiled(args)
    if compiled is None:
        return 2
    cases = _cases(args.cases)
    failed = 0
    for n, case in enumerate(cases, 1):
        caller, call, now = _case(case, args.cases, n)
        decision = compiled.decide(caller, call, now)
        got = "allow" if decision.allowed else "deny"
        if got != case["expect"]:
            failed += 1
            print(f"FAIL case {n} ({_label(case, call)}): expected {case['expect']}, got {got}"
                  f" ({_why(decision.policies, decision.reason, decision.errors)})")
    print(f"policy test: {len(cases) - failed} of {len(cases)} cases as expected")
    return 1 if failed else 0


def explain(args: argparse.Namespace) -> int:
    compiled = _compiled(args)
    if compiled is None:
        return 2
    cases = _cases(args.cases)
    chosen = range(1, len(cases) + 1) if args.case is None else [args.case]
    for n in chosen:
        if not 1 <= n <= len(cases):
            raise ConfigError(f"policy: {args.cases} has no case {n}")
        caller, call, now = _case(cases[n - 1], args.cases, n)
        decision = compiled.decide(caller, call, now)
        print(f"case {n} ({_label(cases[n - 1], call)}):")
        print(f"  decision: {'allow' if decision.allowed else 'deny'}")
        kind = "permitted by" if decision.allowed else "forbidden by"
        print(f"  {kind}: {', '.join(decision.policies) or '(no policy)'}")
        if not decision.allowed:
            print(f"  reason: {decision.reason}")
        for error in decision.errors:
            print(f"  error: {error}")
        if decision.shadow is not None:
            s = decision.shadow
            print(f"  shadow decision: {'allow' if s.allowed else 'deny'} "
                  f"({_why(s.policies, s.reason, s.errors)})")
        if call.method in _METHODS.values():
            listed = could_permit(compiled, caller, call.method, call.endpoint, call.name,
                                  zone=call.zone, era=call.era, now=now)
            print(f"  listed for this caller: {'yes' if listed else 'no'}")
    return 0


def schema(args: argparse.Namespace) -> int:
    cfg = _config(args)
    catalog, source = _catalog(cfg, args)
    print(f"policy schema: {source}", file=sys.stderr)
    print(catalog.schema_json())
    return 0


# -- the pieces ---------------------------------------------------------------------------------

def _config(args: argparse.Namespace) -> Config:
    if not args.config:
        raise ConfigError("config: no file given: pass --config PATH or set TOLLHOUSE_CONFIG")
    return load(args.config)


def _compiled(args: argparse.Namespace) -> Policies | None:
    """The policies the gateway decides with, the config file's and those stored through
    /api/v1/policies, loaded and validated together; None (the problem printed) when they
    are not, or when there are none."""
    cfg = _config(args)
    try:
        files = read_policies(cfg.policy.files, Path(args.config).resolve().parent,
                              cfg.policy.mode) if cfg.policy.files else []
        added = _added(cfg)
        if not files and not added:
            print("tollhouse: policy: the config names no [policy] files and the database "
                  "holds no policy", file=sys.stderr)
            return None
        catalog, _ = _catalog(cfg, args)
        policies = [*files, *added]
        validate(policies, catalog)
    except PolicyError as exc:
        print(f"tollhouse: {exc}", file=sys.stderr)
        return None
    return Policies(policies, catalog)


def _added(cfg: Config) -> list[Policy]:
    """The policies stored through /api/v1/policies (none when the table cannot be read), with
    `[policy] mode = "shadow"` making them shadow as it does the files'."""
    from proxy.policy_store import parse_one
    from proxy.storage.db import Database

    with Database(cfg.database.url) as database:
        try:
            with database.transaction() as conn:
                rows = conn.execute("SELECT id, text, mode FROM policies ORDER BY id").fetchall()
        except (*database.errors, *database.missing_table):
            return []
    return [parse_one(text, pid, "shadow" if cfg.policy.mode == "shadow" else mode)
            for pid, text, mode in rows]


def _catalog(cfg: Config, args: argparse.Namespace) -> tuple[Catalog, str]:
    """The catalog from `--tools` or the database, and a line saying where it came from."""
    if getattr(args, "tools", None):
        targets = list(_tools_file(Path(args.tools)))
        return Catalog(targets, cfg.policy.claims), f"tools from {args.tools}"
    targets, attributes, note = _stored(cfg)
    return Catalog(targets, cfg.policy.claims, attributes), note


def _tools_file(path: Path) -> Iterable[Target]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"policy: cannot read --tools {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"policy: --tools {path} must be a JSON object of endpoints")
    for endpoint, listed in sorted(doc.items()):
        tools = listed.get("tools", []) if isinstance(listed, dict) else listed
        prompts = listed.get("prompts", []) if isinstance(listed, dict) else []
        yield from (Target.tool(endpoint, t) for t in tools if isinstance(t, dict) and "name" in t)
        yield from (Target.prompt(endpoint, p) for p in prompts
                    if isinstance(p, dict) and "name" in p)


def _stored(cfg: Config) -> tuple[list[Target], list[str], str]:
    """The tools as last seen in the database, with their hints and argument schemas."""
    from proxy.seen_targets import read_targets
    from proxy.storage.db import Database

    with Database(cfg.database.url) as database:
        try:
            targets, attributes = read_targets(database)
        except (*database.errors, *database.missing_table) as exc:
            return [], [], (f"the database {database!r} could not be read ({exc}): no tools "
                            "known; pass --tools FILE")
    return targets, attributes, (
        f"{len(targets)} tools as last seen in the database, "
        f"{sum(1 for t in targets if t.input_schema)} of them with their argument schemas "
        "(the others have no known arguments)")


def _cases(path: str) -> list[dict[str, Any]]:
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"policy: cannot read {path}: {exc}") from None
    cases = doc.get("case")
    if not isinstance(cases, list) or not cases:
        raise ConfigError(f"policy: {path} has no [[case]]")
    return cases


def _case(case: dict[str, Any], path: str, n: int) -> tuple[Caller, Call, dt.datetime | None]:
    where = f"policy: {path}: case {n}"
    who = case.get("principal") or {}
    if not isinstance(who, dict) or not ("key" in who or "subject" in who):
        raise ConfigError(f"{where}: principal needs subject (and issuer) or key")
    if case.get("expect") not in ("allow", "deny"):
        raise ConfigError(f"{where}: expect must be \"allow\" or \"deny\"")
    if "endpoint" not in case:
        raise ConfigError(f"{where}: endpoint is required")
    extra = {"groups": frozenset(who.get("groups", ())), "claims": who.get("claims", {}),
             "attributes": who.get("attributes", {}), "client": who.get("client", "")}
    caller = (Caller.key(str(who["key"]), **extra) if "key" in who
              else Caller.person(str(who.get("issuer", "")), str(who["subject"]), **extra))
    kind = next((k for k in _METHODS if k in case), None)
    method = case.get("method") or (_METHODS[kind] if kind else "")
    if not method:
        raise ConfigError(f"{where}: name a tool, prompt or resource (or a list method)")
    call = Call(method, str(case["endpoint"]), str(case.get(kind, "")) if kind else "",
                case.get("arguments", {}), str(case.get("zone", "")), str(case.get("era", "")))
    when = case.get("time")
    if isinstance(when, str):
        when = dt.datetime.fromisoformat(when)
    if isinstance(when, dt.datetime) and when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return caller, call, when if isinstance(when, dt.datetime) else None


def _label(case: dict[str, Any], call: Call) -> str:
    name = case.get("name")
    target = f"{call.method} {call.endpoint}/{call.name}".rstrip("/")
    return f"{name}: {target}" if name else target


def _why(policies: tuple[str, ...], reason: str, errors: tuple[str, ...]) -> str:
    parts = [f"policies: {', '.join(policies)}" if policies else "no deciding policy"]
    if reason:
        parts.append(f"reason: {reason}")
    parts.extend(f"error: {e}" for e in errors)
    return "; ".join(parts)
