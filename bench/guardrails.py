"""The guardrails' cost, in process (a benchmark, not a test): microseconds per KB of result
inspected with every detector on, and the cost for a call no guardrail matches.

    .venv/bin/python bench/guardrails.py [--kb 64] [--rounds 7]

The result corpus is what tool results carry: prose, JSON records with ids, dates, amounts,
UUIDs and hashes, a base64 image, and a few findings (an email, a card number, a key id). It is
inspected as a tools/call result (text content plus structured content), redacting, through
the policy's own rewriter, and as plain text through the detector alone. Figures go in
bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import hashlib
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.guardrails import Guardrails
from policies.guardrails.detect import Detector
from proxy.auth.principal import Principal
from proxy.chain import CallContext
from proxy.config import from_dict
from proxy.jsonrpc import parse

PROSE = ("The shipment left the warehouse on 2026-11-30 at 14:05 and is due on Friday. "
         "Invoice INV-2026-0042 covers 3 items for a total of 149.90 EUR, page 2 of 5. ")


def corpus(kb: int, rng: random.Random) -> tuple[str, dict[str, Any]]:
    parts: list[str] = []
    records: list[dict[str, Any]] = []
    size = 0
    while size < kb * 1024:
        record = {"id": str(uuid.UUID(int=rng.getrandbits(128))), "order": rng.randrange(10**8),
                  "sha": hashlib.sha256(rng.randbytes(8)).hexdigest(),
                  "note": PROSE, "amount": round(rng.random() * 1000, 2)}
        records.append(record)
        parts.append(PROSE)
        size += len(PROSE) + len(orjson.dumps(record))
        if len(records) % 20 == 0:
            image = base64.b64encode(rng.randbytes(1500)).decode()
            parts.append(f"data:image/png;base64,{image} ")
            size += len(image)
    parts.append("Contact carol@example.com, card 4111 1111 1111 1111, key AKIAIOSFODNN7EXAMPLE.")
    text = "".join(parts)
    return text, {"content": [{"type": "text", "text": text}],
                  "structuredContent": {"records": records}}


def best(samples: list[float]) -> str:
    return f"median {statistics.median(samples):.1f}, min {min(samples):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    text, result = corpus(args.kb, random.Random(1))
    result_kb = len(orjson.dumps(result)) / 1024
    detector = Detector(["secrets", "card_numbers", "iban", "email", "phone"])
    cfg = from_dict({"upstreams": [{"name": "e", "url": "http://u/",
                                    "screening": {"mode": "off"}}],
                     "guardrails": [{"name": "all", "tools": ["leaky_*"]}]}, env={})
    policy = Guardrails(cfg)
    ctx = CallContext(principal=Principal(subject="a", issuer="i"), endpoint="e",
                      upstream_url="http://u/")
    call = parse(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                               "params": {"name": "leaky_lookup", "arguments": {"q": "x"}}}))
    other = parse(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                "params": {"name": "weather", "arguments": {"city": "Paris"}}}))

    text_us, result_us = [], []
    for _ in range(args.rounds):
        t = time.perf_counter()
        found = detector.find(text)
        text_us.append((time.perf_counter() - t) * 1e6 / (len(text) / 1024))
        copied = copy.deepcopy(result)
        rewrite = policy.rewriter(call, ctx)
        assert rewrite is not None
        t = time.perf_counter()
        rewrite(copied)
        result_us.append((time.perf_counter() - t) * 1e6 / result_kb)
    assert {f.kind for f in found} == {"email", "card_number", "secret"}, found

    n = 20000
    unmatched: list[float] = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        for _ in range(n):
            policy.rewriter(other, ctx)
        unmatched.append((time.perf_counter() - t) * 1e6 / n)
    loop = asyncio.new_event_loop()
    checks: list[float] = []
    for _ in range(args.rounds):
        async def many() -> None:
            for _ in range(n):
                await policy.check(other, ctx)
        t = time.perf_counter()
        loop.run_until_complete(many())
        checks.append((time.perf_counter() - t) * 1e6 / n)
    loop.close()
    print(f"text {len(text) / 1024:.0f} KB, all detectors: µs/KB {best(text_us)}")
    print(f"tools/call result {result_kb:.0f} KB (text + structured), redacting: "
          f"µs/KB {best(result_us)}")
    print(f"a call no guardrail matches: rewriter µs/call {best(unmatched)}; "
          f"check (arguments) µs/call {best(checks)}")


if __name__ == "__main__":
    main()
