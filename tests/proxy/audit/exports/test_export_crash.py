"""An audit export across a kill -9 (#39 item 2): a real gateway process (`python -m proxy
serve`) under concurrent load streams its audit records to a signed webhook, is killed with
SIGKILL mid-load and started again on the same database while the receiver is down; once the
receiver is back, it must hold every record the audit table holds, each event id with one
payload however often it came, the first arrival of each in the order the records were
committed, and nothing that is not in the audit table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from proxy.audit.commit import COLUMNS
from proxy.audit.exports.queue import event_id, native
from tests import db_backends, state_backends
from tests.durability.test_crash import Load, gateway
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import free_port, until
from tests.proxy.audit.exports.receivers import WEBHOOK_SECRET, WebhookReceiver
from tests.proxy.audit.exports.test_exports import first_of_each
from tests.servers import serve

CLIENTS = 4
DEADLINE_S = 60.0  # the killed gateway's lease (15 s) ends before the new one takes over


def tables(receiver_url: str, upstream_url: str) -> dict[str, Any]:
    port = free_port()
    return {
        "server": {"listen": f"127.0.0.1:{port}", "public_url": f"http://127.0.0.1:{port}",
                   "shutdown_grace_s": 1.0},
        "database": {"url": db_backends.url()},
        "state": state_backends.state(),
        "upstreams": [{"name": "up", "url": f"{upstream_url}/mcp"}],
        "audit": {"exports": [{"name": "siem", "kind": "webhook", "url": f"{receiver_url}/hook",
                               "secret": WEBHOOK_SECRET, "format": "native", "batch": 20,
                               "timeout_s": 2.0, "retry_max_s": 1.0}]},
    }


def audit_events() -> list[tuple[str, dict[str, Any]]]:
    rows = db_backends.rows(db_backends.url(), f"SELECT {', '.join(COLUMNS)} FROM audit "
                                               "ORDER BY id")
    return [(eid, native(COLUMNS, row, eid)) for row in rows for eid in (event_id(row),)]


async def load_until(load: Load, enough: int) -> list[asyncio.Task[None]]:
    clients = [asyncio.create_task(load.client(i)) for i in range(CLIENTS)]
    await until(lambda: len(load.answered) >= enough, DEADLINE_S, f"{enough} calls answered")
    return clients


async def test_an_export_survives_a_kill_and_a_receiver_outage(tmp_path: Path) -> None:
    receiver = WebhookReceiver()
    app, _ = stateless_json_app()
    async with serve(receiver) as r_url, serve(app, graceful_timeout=1) as u_url:
        first_tables = tables(r_url, u_url)
        async with gateway(tmp_path, "first", first_tables) as first:
            load = Load(f"{first.url}/mcp/up")
            clients = await load_until(load, 40)
            try:
                await until(lambda: len(receiver.events) >= 10, DEADLINE_S,
                            "deliveries under way")
                first.kill()  # mid-load, mid-delivery
                assert await asyncio.wait_for(first.process.wait(), DEADLINE_S) == -9
            finally:
                load.stop = True
                await asyncio.wait_for(asyncio.gather(*clients), DEADLINE_S)
        receiver.up = False  # the SIEM is down while the gateway comes back
        second_tables = tables(r_url, u_url)
        async with gateway(tmp_path, "second", second_tables) as second:
            again = Load(f"{second.url}/mcp/up")
            clients = await load_until(again, 20)
            again.stop = True
            await asyncio.wait_for(asyncio.gather(*clients), DEADLINE_S)
            # the new gateway takes the export over once the killed one's lease ends, and
            # finds the receiver down
            try:
                await until(lambda: receiver.refused > 0, DEADLINE_S, "a send refused")
            except AssertionError as failed:
                raise AssertionError(f"{failed}; the gateway said:\n"
                                     f"{second.output()[-3000:]}") from None
            receiver.up = True
            want: list[tuple[str, dict[str, Any]]] = []

            def complete() -> bool:
                want[:] = audit_events()
                answered = load.answered | again.answered
                ids = {p["request_id"] for _, p in want}
                return answered <= ids and {e for e, _ in want} <= set(receiver.ids())

            try:
                await until(complete, DEADLINE_S, "every record at the receiver")
            except AssertionError as failed:
                missing = {e for e, _ in want} - set(receiver.ids())
                raise AssertionError(
                    f"{failed}: {len(missing)} of {len(want)} records missing; received "
                    f"{len(receiver.events)}, refused {receiver.refused}, bad {receiver.bad}; "
                    f"the gateway said:\n{second.output()[-3000:]}") from None
        assert not receiver.bad
        got = first_of_each(receiver.events)  # a repeat has the payload of the first
        assert [e for e, _ in got] == [e for e, _ in want]  # none lost, none foreign, in order
        assert [p for _, p in got] == [p for _, p in want]
        assert len(receiver.events) >= len(want)
