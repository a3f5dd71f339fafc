"""The cluster soak's books: the metering receiver (`Ledger`), the audit table as the run left
it, and the reconciliation of every answered call against both, printed as counts.

An answered call is one whose client got its own text back. Its audit record is the
`tools/call` record of its (principal, request id); its usage event is the one delivered under
that record's `call_id`. A call without a record has no call id to look its usage event up
by: a usage event of the same principal whose call id no record has ("usage without a
record") stands for it, one each; without one its usage is counted lost too.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from aiohttp import web
from cluster_callers import Answered, Tally
from soak import Receiver

LISTED = 40  # lost calls listed one by one, at most


@dataclass
class Fault:
    at: float  # seconds into the run
    kind: str  # "kill" or "drain"
    replica: str
    exit_code: int | None = None
    back_at: float | None = None  # serving again (ready), seconds into the run
    note: str = ""

    def __str__(self) -> str:
        back = f", back at {self.back_at:.0f} s" if self.back_at is not None else ""
        return (f"{self.at:.0f} s {self.kind} {self.replica}"
                f"{' (' + self.note + ')' if self.note else ''}{back}")


class Ledger(Receiver):
    """soak.py's receiver, keeping what reconciliation needs: deliveries per call id, each
    event's principal, and the call ids authorized (with their principal)."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.times: Counter[str] = Counter()
        self.principal_of: dict[str, str] = {}
        self.authorized: dict[str, str] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()  # aiohttp keeps the body: Receiver.handle reads it again
        call_id = str(body.get("call_id"))
        if body.get("type") == "authorize":
            self.authorized[call_id] = str(body.get("principal"))
        else:
            self.times[call_id] += 1
            self.principal_of[call_id] = str(body.get("principal"))
        return await super().handle(request)


class Row(NamedTuple):
    principal: str
    request_id: str
    status: str
    call_id: str | None
    session_hash: str | None
    error_message: str | None


def _request_id(stored: str | None) -> str:
    """A request id as the client sent it: stored as JSON (`5`, `"m0-3"`)."""
    try:
        return str(json.loads(stored or ""))
    except ValueError:
        return str(stored)


def audit_rows(database_url: str) -> list[Row]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT principal, request_id, status, call_id, session_hash, "
                            "error_message FROM audit WHERE method = 'tools/call'").fetchall()
    return [Row(str(p), _request_id(r), str(s), c, h, e) for p, r, s, c, h, e in rows]


def _balancer(log: str, ports: dict[str, str]) -> tuple[Counter[str], Counter[str]]:
    """(GETs with Last-Event-ID by status, requests by replica) from the balancer's log."""
    resumed: Counter[str] = Counter()
    served: Counter[str] = Counter()
    for line in log.splitlines():
        parts = line.split(" ")
        if len(parts) != 5 or parts[0] != "SOAK":
            continue
        _, server, status, method, lei = parts
        served[ports.get(server, server)] += 1
        if method == "GET" and lei not in ("lei=", "lei=-"):
            resumed[status] += 1
    return resumed, served


def report(args: argparse.Namespace, tally: Tally, traffic_s: float, faults: list[Fault],
           ledger: Ledger, rows: list[Row], undelivered: int, exits: list[int | None],
           balancer_log: str, replicas: list[Any]) -> str:
    by_call: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        by_call[(row.principal, row.request_id)].append(row)
    recorded = {row.call_id for row in rows if row.call_id}
    without_record: dict[str, list[str]] = defaultdict(list)
    for call_id in ledger.times:
        if call_id not in recorded:
            without_record[ledger.principal_of[call_id]].append(call_id)
    orphans = sum(len(v) for v in without_record.values())
    lost_audit: list[Answered] = []
    twice_audit: list[Answered] = []
    not_ok: list[Answered] = []
    other_session: list[Answered] = []
    lost_usage: list[Answered] = []
    twice_usage: list[Answered] = []
    stood_in: list[str] = []
    for call in tally.answered:
        found = by_call.get((call.principal, call.request_id), [])
        if not found:
            lost_audit.append(call)
            if without_record.get(call.principal):
                stood_in.append(without_record[call.principal].pop())
            else:
                lost_usage.append(call)
            continue
        if len(found) > 1:
            twice_audit.append(call)
        if not any(r.status == "ok" for r in found):
            not_ok.append(call)
        if call.session_hash and any(r.session_hash != call.session_hash for r in found):
            other_session.append(call)
        times = [ledger.times[r.call_id] for r in found if r.call_id]
        if not any(times):
            lost_usage.append(call)
        elif max(times) > 1:
            twice_usage.append(call)
    resumed_gets, served = _balancer(balancer_log, {f"127.0.0.1:{r.port}": r.name
                                                    for r in replicas})
    answered = tally.answered
    sdk = [a for a in answered if a.era == "sdk"]
    on_resumed = [a for a in sdk if a.resumed]
    authorized_unrecorded = [c for c in ledger.authorized if c not in recorded]
    lines = [
        (f"# Cluster soak: {traffic_s:.0f} s of traffic, {args.replicas} replicas behind "
        f"{args.balancer}, {args.clients_sdk} SDK + {args.clients_modern} modern callers, "
        f"echo delay 0-{args.max_delay_ms} ms"), "",
        f"Faults: {'; '.join(map(str, faults)) or 'none'}.",
        (f"Requests through the balancer by replica: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(served.items()))}."), "",
        "| count | calls |", "|---|---:|",
        f"| answered (the client got its own text back) | {len(answered)} |",
        (f"| ... by SDK clients / on a resumed stream / by modern callers | {len(sdk)} / "
        f"{len(on_resumed)} / {len(answered) - len(sdk)} |"),
        f"| lost audit (answered, no `tools/call` record) | {len(lost_audit)} |",
        f"| duplicated audit (answered, two or more records) | {len(twice_audit)} |",
        f"| audited as not served (answered, no record `ok`) | {len(not_ok)} |",
        (f"| audited under another session (SDK: a record's session hash is not the client's) "
        f"| {len(other_session)} |"),
        f"| lost usage (answered, no usage event delivered) | {len(lost_usage)} |",
        (f"| duplicated usage (answered, its event delivered more than once: at-least-once) "
        f"| {len(twice_usage)} |"), "",
        (f"Audit: {len(rows)} `tools/call` records "
        f"({', '.join(f'{k} {v}' for k, v in sorted(Counter(r.status for r in rows).items()))})."
        f" Usage events: {sum(ledger.times.values())} deliveries of {len(ledger.times)} call "
        f"ids; {orphans} call ids without a record ({len(stood_in)} stood in for answered calls "
        f"without one); {undelivered} still in the outbox at the end. Authorized call ids "
        f"without a record: {len(authorized_unrecorded)} (calls the killed replicas held; "
        f"answered or not)."),
        (f"GETs with Last-Event-ID: {tally.resumes} sent by the SDK clients; through the "
        f"balancer by status: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(resumed_gets.items())) or 'none'}."),
        f"Replica exit codes on the final SIGTERM: {exits}.", "",
        "| client-visible outcome | calls |", "|---|---:|",
        *(f"| {k} | {v} |" for k, v in sorted(tally.outcomes.items())),
    ]
    if lost_audit or lost_usage or not_ok:
        lines += ["", "Lost (at most the first 40):", ""]
        flagged = {id(a): a for a in [*lost_audit, *lost_usage, *not_ok]}
        for call in sorted(flagged.values(), key=lambda a: a.at)[:LISTED]:
            found = by_call.get((call.principal, call.request_id), [])
            before = [f for f in faults if f.at <= call.at]
            lines.append(
                f"- {call.at:.1f} s, {call.era} {call.principal} request {call.request_id}"
                f"{' session ' + call.session_hash if call.session_hash else ''}: answered on "
                f"{'a resumed stream (GET Last-Event-ID)' if call.resumed else 'its own POST'};"
                f" records: {[(r.status, r.error_message) for r in found] or 'none'}; "
                f"usage delivered: {[ledger.times[r.call_id] for r in found if r.call_id]}; "
                f"its principal's authorized calls without a record: "
                f"{sum(ledger.authorized[c] == call.principal for c in authorized_unrecorded)}; "
                f"last fault before: {before[-1] if before else 'none'}")
    return "\n".join(lines)
