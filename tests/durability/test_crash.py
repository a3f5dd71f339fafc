"""Nothing answered is lost to a crash: a real gateway process (`python -m proxy serve`) under
concurrent load, metered through a webhook, is killed with SIGKILL and started again on the
same database (the run's: a SQLite file or a PostgreSQL database). Every call whose result a
client received must then have exactly one audit record, and its usage event must reach the
receiver (which counts distinct call ids); no call is in the audit log twice."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests import db_backends, state_backends
from tests.e2e.test_metering import SECRET, Receiver
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import until
from tests.replicas.harness import Replica, _healthy, _start_replica, _stop, free_port
from tests.servers import serve

CLIENTS = 16  # concurrent connections, each a call at a time
KILL_AFTER = 120  # answered calls before the kill: the load is well under way
DEADLINE_S = 30.0
HEADERS = {"content-type": "application/json",
           "accept": "application/json, text/event-stream"}


def config(receiver_url: str, upstream_url: str, port: int) -> dict[str, Any]:
    return {
        "server": {"listen": f"127.0.0.1:{port}", "public_url": f"http://127.0.0.1:{port}",
                   "shutdown_grace_s": 1.0},
        "database": {"url": db_backends.url()},
        "state": state_backends.state(),
        "metering": {"url": receiver_url, "secret": SECRET, "timeout_ms": 5000},
        "upstreams": [{"name": "up", "url": f"{upstream_url}/mcp"}],
    }


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, name: str, tables: dict[str, Any]) -> AsyncIterator[Replica]:
    port = int(tables["server"]["listen"].rpartition(":")[2])
    process = await _start_replica(name, port, tables, tmp_path)
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            await _healthy(process, client)
        yield process
    finally:
        await _stop(process.process)


class Load:
    """`CLIENTS` clients calling `echo` back to back, each call with an id of its own; which
    ids were answered with a result, and how many calls failed once the gateway was gone."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.answered: set[str] = set()
        self.failed = 0
        self.enough = asyncio.Event()
        self.stop = False

    async def client(self, worker: int) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            n = 0
            while not self.stop:
                n += 1
                call = f"w{worker}-{n}"
                body = orjson.dumps({"jsonrpc": "2.0", "id": call, "method": "tools/call",
                                     "params": {"name": "echo", "arguments": {"text": call}}})
                try:
                    response = await http.post(self.endpoint, content=body, headers=HEADERS)
                except httpx.TransportError:  # the gateway died under this call
                    self.failed += 1
                    return
                answer = response.json() if response.status_code == 200 else {}
                if answer.get("id") == call and "result" in answer:
                    self.answered.add(call)
                    if len(self.answered) >= KILL_AFTER:
                        self.enough.set()


async def test_a_killed_gateway_loses_no_answered_call(tmp_path: Path) -> None:
    receiver = Receiver()
    app, _probe = stateless_json_app()
    async with serve(receiver) as r_url, serve(app, graceful_timeout=1) as u_url:
        tables = config(r_url, u_url, free_port())
        async with gateway(tmp_path, "first", tables) as first:
            load = Load(f"{first.url}/mcp/up")
            clients = [asyncio.create_task(load.client(i)) for i in range(CLIENTS)]
            try:
                await asyncio.wait_for(load.enough.wait(), DEADLINE_S)
                first.kill()  # mid-load: calls in flight, records in the writer's hands
                assert await asyncio.wait_for(first.process.wait(), DEADLINE_S) == -9
            finally:
                load.stop = True
                await asyncio.wait_for(asyncio.gather(*clients), DEADLINE_S)
        answered = set(load.answered)
        assert len(answered) >= KILL_AFTER and load.failed > 0  # the kill cut calls short
        restarted = {**tables, "server": {**tables["server"], "listen": f"127.0.0.1:{free_port()}"}}
        async with gateway(tmp_path, "second", restarted):  # same database, a new process
            # the killed run's journal is replayed by the new writer thread, which the health
            # check does not wait for: every answered call's one record is there once it is done
            rows: list[tuple[Any, ...]] = []

            def recorded() -> bool:
                rows[:] = db_backends.rows(db_backends.url(), "SELECT request_id, call_id "
                                                              "FROM audit WHERE method = "
                                                              "'tools/call'")
                return answered <= {request_id for request_id, _ in rows}

            with contextlib.suppress(AssertionError):
                await until(recorded, DEADLINE_S, "the replay of the killed run's journal")
            call_ids = {request_id: call_id for request_id, call_id in rows}
            missing = sorted(answered - set(call_ids))
            assert not missing, f"{len(missing)} answered calls have no audit record"
            assert len(rows) == len(call_ids), "a call is in the audit log twice"
            wanted = {call_ids[c] for c in answered}
            assert None not in wanted
            end = time.monotonic() + DEADLINE_S
            while not wanted <= set(receiver.settled):
                remaining = end - time.monotonic()
                assert remaining > 0, (f"{len(wanted - set(receiver.settled))} answered calls' "
                                       "usage events never reached the receiver")
                receiver.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(receiver.changed.wait(), remaining)
    # the outbox holds each call once (its key), and the receiver got no unknown call
    outbox = db_backends.rows(db_backends.url(), "SELECT call_id FROM usage_outbox")
    assert len(outbox) == len({c for (c,) in outbox}) == len({c for c in call_ids.values() if c})
    assert set(receiver.settled) <= set(call_ids.values())
    assert receiver.bad_signatures == 0
