"""Cluster soak: N gateway replicas on one PostgreSQL and one Redis behind a round-robin
balancer, callers of both eras, a replica killed (kill -9) every `--kill-every` seconds and one
drained; then every answered call reconciled against the audit log and the usage events.

    .venv/bin/python bench/cluster_soak.py [--duration 600] [--replicas 3] [--kill-every 30]
        [--clients-sdk 4] [--clients-modern 2] [--balancer haproxy|nginx] [--max-delay-ms 300]
        [--source DIR]  # replicas from another checkout (before/after a change)

Not part of CI: a figure (bench/README.md, "Cluster soak"). Everything listens on 127.0.0.1.
The run makes a fresh PostgreSQL database (127.0.0.1:5432, trust) and a fresh Redis key
prefix (127.0.0.1:6379), and drops both at the end; its logs (and `report.md`) stay in the
directory it prints.

* upstream: `cluster_upstream.py`, the official SDK's `MCPServer` with an event store, its
  `echo` answering after a random 0-`--max-delay-ms` ms, so kills land mid-call and a 2025-11-25
  client whose POST stream breaks resumes it (GET + `Last-Event-ID`, through any replica);
* replicas: `python -m proxy serve`, JWT callers, the metering webhook on every `tools/call`;
* balancer: HAProxy or nginx, round robin, no stickiness, no re-sending of a request a replica
  took (HAProxy `retry-on conn-failure`, nginx's default `proxy_next_upstream`), each request
  logged (replica, status, method, `Last-Event-ID`);
* callers (`cluster_callers.py`): `--clients-sdk` official SDK clients in sessions and
  `--clients-modern` raw 2026-07-28 sessionless callers, each principal its own;
* faults: every `--kill-every` s the next replica in turn is SIGKILLed and started again 3 s
  later; once, between two kills near the middle, the next one is sent SIGTERM (a drain), and
  started again 3 s after it exits.

At the end: the callers finish their calls, every replica is up, the usage outbox is waited
for until empty (at most 90 s), the replicas are stopped (SIGTERM), and each answered call is
looked for in the audit table by (principal, request id) and in the usage events the receiver
took by the record's call id.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
from cluster_callers import Tally, modern_caller, sdk_caller
from cluster_report import Fault, Ledger, audit_rows, report
from procs import free_port
from soak import AUDIENCE, ISSUER
from variants import JWT_AUTH, delete_keys

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PYTHON = sys.executable
POSTGRES = "postgresql://postgres@127.0.0.1:5432"  # trust auth; a database per run
REDIS = "redis://127.0.0.1:6379/0"  # a key prefix per run
RESTART_AFTER_S = 3.0
START_DEADLINE_S = 60.0  # a replica imports everything and migrates: seconds on a busy box
SHUTDOWN_GRACE_S = 5
OUTBOX_DEADLINE_S = 90.0
CONFIG = """\
[server]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{lb_port}"
shutdown_grace_s = {grace}
""" + JWT_AUTH + """\
[database]
url = "{database_url}"
[state]
url = "{redis_url}"
key_prefix = "{prefix}"
timeout_s = 5
[[upstreams]]
name = "soak"
url = "http://127.0.0.1:{up_port}/mcp"
total_timeout_s = 30
[metering]
url = "http://127.0.0.1:{meter_port}/meter"
secret = "{meter_secret}"
methods = ["tools/call"]
timeout_ms = 1000
retry_max_s = 2
"""
HAPROXY = """\
global
    log stdout format raw local0
    maxconn 4096
    nbthread 1
defaults
    mode http
    log global
    option logasap
    option http-server-close
    timeout connect 2s
    timeout client 3600s
    timeout server 3600s
    timeout tunnel 3600s
    timeout check 2s
    retries 3
    option redispatch 1
    retry-on conn-failure
frontend soak
    bind 127.0.0.1:{lb_port}
    http-request set-var(txn.lei) req.hdr(last-event-id)
    log-format "SOAK %s %ST %HM lei=%[var(txn.lei)]"
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /readyz
{servers}
"""
NGINX = """\
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format soak 'SOAK $upstream_addr $status $request_method lei=$http_last_event_id';
    access_log {tmp}/balancer.log soak;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    upstream replicas {{
{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{lb_port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_read_timeout 3600s;
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""


@dataclass
class Replica:
    name: str
    port: int
    config: Path
    log: Path
    source: Path = REPO  # the checkout whose `proxy` package it runs
    proc: subprocess.Popen[bytes] | None = None

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "proxy", "serve", "--config", str(self.config), "--log-level",
                 "warning"], cwd=self.source, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: signal.Signals) -> None:
        if self.up:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    async def ready(self, http: httpx.AsyncClient) -> None:
        end = time.monotonic() + START_DEADLINE_S
        while True:
            if not self.up:
                raise RuntimeError(f"replica {self.name} exited; see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"http://127.0.0.1:{self.port}/readyz")).status_code == 200:
                    return
            if time.monotonic() > end:
                raise RuntimeError(f"replica {self.name} not ready in {START_DEADLINE_S} s; "
                                 f"see {self.log}")
            await asyncio.sleep(0.2)  # poll interval

    async def exited(self, deadline_s: float) -> int | None:
        """The exit code once it has exited (within `deadline_s`, else None)."""
        end = time.monotonic() + deadline_s
        while self.proc is not None and self.proc.poll() is None and time.monotonic() < end:
            await asyncio.sleep(0.1)  # poll interval
        return None if self.proc is None else self.proc.poll()


def balancer_command(kind: str, tmp: Path, lb_port: int, replicas: list[Replica]) -> list[str]:
    if shutil.which(kind) is None:
        raise SystemExit(f"{kind} is not installed (apt-get install -y {kind})")
    if kind == "haproxy":
        servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} check inter 500ms fall 2 "
                            "rise 1" for r in replicas)
        (tmp / "haproxy.cfg").write_text(HAPROXY.format(lb_port=lb_port, servers=servers))
        return ["haproxy", "-db", "-f", str(tmp / "haproxy.cfg")]
    servers = "\n".join(f"        server 127.0.0.1:{r.port} max_fails=1 fail_timeout=2s;"
                        for r in replicas)
    (tmp / "nginx.conf").write_text(NGINX.format(tmp=tmp, lb_port=lb_port, servers=servers))
    return ["nginx", "-p", str(tmp), "-c", str(tmp / "nginx.conf")]


def schedule(duration: float, kill_every: float) -> list[tuple[float, str]]:
    """(seconds into the run, "kill" or "drain"): kills every `kill_every` s while a restart
    still falls inside the run, one drain half-way between two kills near the middle."""
    plan = []
    t = kill_every
    while t + RESTART_AFTER_S < duration:
        plan.append((t, "kill"))
        t += kill_every
    drain = (int(duration / 2 // kill_every) + 0.5) * kill_every
    if drain + SHUTDOWN_GRACE_S + RESTART_AFTER_S >= duration:
        drain = duration / 2
    return sorted([*plan, (drain, "drain")])


async def run_faults(replicas: list[Replica], plan: list[tuple[float, str]], tally: Tally,
                     faults: list[Fault], http: httpx.AsyncClient) -> list[asyncio.Task[None]]:
    turn = itertools.cycle(replicas)
    restarts: list[asyncio.Task[None]] = []

    async def restart(replica: Replica, fault: Fault) -> None:
        if fault.kind == "drain":
            fault.exit_code = await replica.exited(SHUTDOWN_GRACE_S + 30)
            replica.signal(signal.SIGKILL)  # one that did not drain in time
            await replica.exited(10)
            fault.note = f"exited {fault.exit_code} after {tally.now() - fault.at:.1f} s"
        await asyncio.sleep(RESTART_AFTER_S)
        replica.start()
        try:
            await replica.ready(http)
        except RuntimeError as exc:  # the run goes on without it; the report says so
            fault.note = f"{fault.note}; not back: {exc}".lstrip("; ")
            return
        fault.back_at = tally.now()

    for at, kind in plan:
        await asyncio.sleep(max(0.0, tally.began + at - time.monotonic()))
        replica = next((r for r in (next(turn) for _ in replicas) if r.up), None)
        if replica is None:
            continue
        fault = Fault(tally.now(), kind, replica.name)
        faults.append(fault)
        replica.signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        restarts.append(asyncio.create_task(restart(replica, fault)))
    return restarts


async def outbox_drained(conninfo: str) -> int:
    """Wait (at most OUTBOX_DEADLINE_S) for every usage event to be delivered; the number
    left undelivered."""
    end = time.monotonic() + OUTBOX_DEADLINE_S
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(
                "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL")).fetchone()
            left = int(row[0]) if row else 0
            if left == 0 or time.monotonic() > end:
                return left
            await asyncio.sleep(0.5)  # poll interval


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of traffic")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=30)
    parser.add_argument("--clients-sdk", type=int, default=4)
    parser.add_argument("--clients-modern", type=int, default=2)
    parser.add_argument("--balancer", choices=("haproxy", "nginx"), default="haproxy")
    parser.add_argument("--max-delay-ms", type=int, default=300,
                        help="each echo answers after a random 0..N ms")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--source", type=Path, default=REPO,
                        help="a checkout whose `proxy` and `policies` the replicas run "
                             "(`python -m proxy` there), e.g. `git archive <commit> proxy "
                             "policies | tar -x -C DIR`; default: this one")
    args = parser.parse_args()
    if args.replicas < 2:
        parser.error("--replicas: at least 2 (a killed replica's calls need another)")
    tmp = Path(tempfile.mkdtemp(prefix="tollhouse-cluster-soak-"))
    dbname = f"tollhouse_soak_{secrets.token_hex(6)}"
    prefix = f"tollhouse-soak:{secrets.token_hex(6)}:"
    secret, meter_secret = secrets.token_hex(32), secrets.token_hex(16)
    lb_port, up_port, meter_port = free_port(), free_port(), free_port()
    database_url = f"{POSTGRES}/{dbname}"
    replicas = [Replica(f"r{i}", free_port(), tmp / f"r{i}.toml", tmp / f"r{i}.log",
                        args.source.resolve()) for i in range(args.replicas)]
    for r in replicas:
        r.config.write_text(CONFIG.format(
            port=r.port, lb_port=lb_port, grace=SHUTDOWN_GRACE_S, issuer=ISSUER, secret=secret,
            audience=AUDIENCE, database_url=database_url, redis_url=REDIS, prefix=prefix,
            up_port=up_port, meter_port=meter_port, meter_secret=meter_secret))
    ledger = Ledger(meter_port)
    others: list[subprocess.Popen[bytes]] = []
    faults: list[Fault] = []
    http = httpx.AsyncClient(timeout=5)
    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    print(f"cluster soak: {args.replicas} replicas behind {args.balancer}, logs in {tmp}",
          flush=True)
    try:
        await ledger.up()
        with (tmp / "upstream.log").open("wb") as out:
            others.append(subprocess.Popen([PYTHON, str(BENCH / "cluster_upstream.py"),  # noqa: ASYNC220
                                            "--port", str(up_port)], stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True))
        replicas[0].start()  # the first one migrates the fresh database alone
        await replicas[0].ready(http)
        for r in replicas[1:]:
            r.start()
        await asyncio.gather(*(r.ready(http) for r in replicas[1:]))
        with (tmp / "balancer.log").open("ab") as out:
            others.append(subprocess.Popen(  # noqa: ASYNC220 (returns at once)
                balancer_command(args.balancer, tmp, lb_port, replicas),
                                           stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        url = f"http://127.0.0.1:{lb_port}/mcp/soak"
        await balanced(http, lb_port)
        began = time.monotonic()
        tally = Tally(began, began + args.duration)
        rng = random.Random(args.seed)
        callers = [sdk_caller(i, url, secret, tally, args.max_delay_ms, rng)
                   for i in range(args.clients_sdk)]
        callers += [modern_caller(i, url, secret, tally, args.max_delay_ms, rng)
                    for i in range(args.clients_modern)]
        plan = schedule(args.duration, args.kill_every)
        faulting = asyncio.create_task(run_faults(replicas, plan, tally, faults, http))
        await asyncio.gather(*callers)
        await asyncio.gather(*await faulting)
        traffic_s = tally.now()
        for r in replicas:  # one that died or did not come back: started again, for its claim
            if not r.up:
                r.start()
        for outcome in await asyncio.gather(*(r.ready(http) for r in replicas),
                                            return_exceptions=True):
            if isinstance(outcome, Exception):
                print(f"at the end: {outcome}", flush=True)
        undelivered = await outbox_drained(database_url)
        for r in replicas:
            r.signal(signal.SIGTERM)
        exits = [await r.exited(SHUTDOWN_GRACE_S + 30) for r in replicas]
        rows = audit_rows(database_url)
        text = report(args, tally, traffic_s, faults, ledger, rows, undelivered, exits,
                      (tmp / "balancer.log").read_text(errors="replace"), replicas)
        (tmp / "report.md").write_text(text + "\n")
        print(text, flush=True)
    finally:
        await http.aclose()
        for r in replicas:
            r.signal(signal.SIGKILL)
        for p in others:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        await ledger.down()
        with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        delete_keys(REDIS, prefix)


async def balanced(http: httpx.AsyncClient, lb_port: int) -> None:
    """Until the balancer answers (its health checks have found the replicas up)."""
    end = time.monotonic() + START_DEADLINE_S
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if (await http.get(f"http://127.0.0.1:{lb_port}/readyz")).status_code == 200:
                return
        if time.monotonic() > end:
            raise SystemExit("the balancer did not answer /readyz in time")
        await asyncio.sleep(0.2)  # poll interval


if __name__ == "__main__":
    asyncio.run(main())
