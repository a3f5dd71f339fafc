"""The per-call cost of a Cedar decision (issue 37, target <= 30 us with 100 policies): a
catalog of 50 tools on 5 endpoints, 1, 10 and 100 policies (permits and forbids on groups,
claims, arguments and time), the call's entities and context built per call as the gateway
would (policies.cedar.Policies.decide), then timed. Also: an endpoint no policy names
(Policies with no policies: one attribute test), the listing check, and the shadow case.

    .venv/bin/python bench/cedar_decide.py

Not a timed test: figures depend on the machine; run it on a quiet one.
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.cedar import Call, Caller, Catalog, Policies, Target, parse, validate
from policies.cedar.listing import Lister

NOW = dt.datetime(2026, 1, 5, 12, tzinfo=dt.UTC)
SCHEMA = {"type": "object", "required": ["amount", "to"], "properties": {
    "amount": {"type": "number"}, "to": {"type": "string"}, "count": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}}}}
TOOLS = [Target.tool(f"e{i % 5}", {"name": f"t{i}", "inputSchema": SCHEMA,
                                   "annotations": {"readOnlyHint": i % 2 == 0}})
         for i in range(50)]
CALL = 'action == Tollhouse::Action::"tools/call"'


def policy(n: int) -> str:
    tool = f'resource == Tollhouse::Tool::"e{n % 5}/t{n % 50}"'
    kinds = [
        f'permit(principal, {CALL}, {tool}) when {{ principal.groups.contains("g{n}") }};',
        (f'permit(principal, {CALL}, {tool}) when '
        f'{{ context.input.amount.lessThan(decimal("{n}.5")) }};'),
        f'forbid(principal, {CALL}, {tool}) when {{ context.input.to == "x{n}" }};',
        (f'permit(principal, {CALL}, resource in Tollhouse::Endpoint::"e{n % 5}") when '
        f'{{ principal.claims has department && principal.claims.department == "d{n}" && '
        f'context.hour < 20 }};'),
    ]
    return kinds[n % len(kinds)]


def per_call_us(fn: object, rounds: int = 5, number: int = 2000) -> float:
    runs = []
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(number):
            fn()  # type: ignore[operator]
        runs.append((time.perf_counter() - began) / number * 1e6)
    return statistics.median(runs)


def main() -> None:
    catalog = Catalog(TOOLS, claims=["department"])
    caller = Caller.person("https://idp.example", "alice", groups=frozenset({"g0", "sre"}),
                           claims={"department": "d3"})
    call = Call("tools/call", "e0", "t0", {"amount": 12.25, "to": "bob", "tags": ["a", "b"]})
    print("Cedar decision per call (median of 5 x 2000; 50 tools on 5 endpoints)")
    empty = Policies([], catalog)
    print(f"  no policies (an endpoint none names): "
          f"{per_call_us(lambda: empty.decide(caller, call, NOW)):7.2f} us")
    for count in (1, 10, 100):
        text = "\n".join(policy(n) for n in range(count))
        parsed = parse(text, "bench.cedar")
        began = time.perf_counter()
        validate(parsed, catalog)
        compiled = Policies(parsed, catalog)
        loaded_ms = (time.perf_counter() - began) * 1e3
        lister = Lister(compiled)
        decide = per_call_us(lambda c=compiled: c.decide(caller, call, NOW))
        # every call with arguments of its own: no decision is reused
        fresh = iter(Call("tools/call", "e0", "t0", {"amount": n / 7, "to": f"r{n}"})
                     for n in range(10**7))
        distinct = per_call_us(lambda c=compiled, f=fresh: c.decide(caller, next(f), NOW))
        request = per_call_us(lambda c=compiled: c.request(caller, call, NOW))
        # every check by a caller of its own: no answer is reused
        people = iter(Caller.person("https://idp.example", f"u{n}", groups=frozenset({"g0"}),
                                    claims={"department": "d3"}) for n in range(10**7))
        listing_fresh = per_call_us(lambda lister=lister, p=people: lister.could_permit(
            next(p), "tools/call", "e0", "t0", now=NOW))
        listing = per_call_us(lambda lister=lister: lister.could_permit(caller, "tools/call", "e0", "t0",
                                                          now=NOW))
        shadowed = Policies(parse(text, "bench.cedar", "shadow") + parse(
            text, "more.cedar"), catalog) if count <= 10 else None
        fresh_shadow = iter(Call("tools/call", "e0", "t0", {"amount": n / 7, "to": f"r{n}"})
                            for n in range(10**7))
        line = (f"  {count:3d} policies: decide {distinct:7.2f} us (building the request "
                f"{request:5.2f} us), the same call again {decide:5.2f} us, listing check {listing_fresh:6.2f} us (again {listing:5.2f} us), validate+compile "
                f"{loaded_ms:7.1f} ms")
        if shadowed is not None:
            shadow = per_call_us(lambda s=shadowed, f=fresh_shadow: s.decide(caller, next(f), NOW))
            line += f", with as many shadow beside: {shadow:7.2f} us"
        print(line)


if __name__ == "__main__":
    main()
