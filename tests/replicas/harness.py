"""Two gateway processes on one Redis and one database, behind a real HAProxy.

`open_cluster(tmp_path, upstream_url)` starts, each on a free loopback port:

* N replicas (two by default): `python -m proxy serve --config <toml>`, each its own process,
  the same database (the test's: one SQLite file, or one PostgreSQL database), the same Redis
  at `REDIS_URL` under a fresh key prefix, one upstream `up`;
* HAProxy (`haproxy -f <cfg> -db`) in front of them: `balance roundrobin`, no stickiness,
  `option http-server-close` so every request is balanced on its own, health checks on
  /healthz, and L7 retries with redispatch so a replica that died is routed around.

It is ready when every replica answers /healthz, is subscribed to the cancel channel (PUBSUB
NUMSUB), and has served a request through HAProxy. At the end every process is stopped and
waited for, and every Redis key under the prefix is deleted.

Which replica served what: audit records do not name a process, so the proof is HAProxy's
log. Each request is one line (`option logasap`: written when the response starts, so a
long-lived SSE stream is logged as soon as it opens) naming the server, the status, the
method and path, the request's `Mcp-Session-Id` and its body; `Cluster.requests()` parses them
into `Served` rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from tests import db_backends
from tests.helpers import DEADLINE_S, free_port, until

REDIS_URL = os.environ.get("TOLLHOUSE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ENDPOINT = "up"
LOG_TAG = "TH"
REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 30.0  # a gateway process imports everything and migrates: ~1 s, more on CI

# Redis keys the gateway may leave under its prefix (proxy/state/*.py), by kind. Every one
# but the bridge's era verdicts expires by itself.
KEY_KINDS = ("ms:", "mp:", "bv:", "bh:", "rl:", "lk:l:", "lk:c:", "br:", "oc:", "fl:", "rv:", "ls:",
             "rg:", "ra:", "cx:", "tk:", "ap:")
KEPT_KINDS = ("bv:",)


def toml_value(value: Any) -> str:
    """A TOML value: JSON's strings, numbers and booleans are TOML's; a dict is an inline
    table, a list an array."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def toml(tables: dict[str, Any]) -> str:
    """`tables` as TOML: each top-level value a table, or an array of tables (a list of
    dicts); within them, a dict is a sub-table and anything else a value."""
    out: list[str] = []

    def table(header: str, name: str, body: dict[str, Any]) -> None:
        out.append(header)
        nested = {k: v for k, v in body.items() if isinstance(v, dict)}
        out.extend(f"{json.dumps(k)} = {toml_value(v)}" for k, v in body.items()
                   if k not in nested)
        for key, value in nested.items():
            table(f"[{name}.{json.dumps(key)}]", f"{name}.{json.dumps(key)}", value)

    for name, value in tables.items():
        if isinstance(value, list):
            for item in value:
                table(f"[[{name}]]", name, item)
        else:
            table(f"[{name}]", name, value)
    return "\n".join(out) + "\n"


@dataclass
class Replica:
    """One gateway process."""

    name: str  # its server name in HAProxy's config and log: r0, r1, ...
    port: int
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"{self.url}/mcp/{ENDPOINT}"

    def kill(self) -> None:
        """SIGKILL: the process ends with no chance to clean up or answer anything."""
        self.process.send_signal(signal.SIGKILL)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass(frozen=True)
class Served:
    """One request as HAProxy logged it."""

    server: str  # the replica's name; "<NOSRV>" when none took it
    status: int
    method: str
    path: str
    session_id: str | None
    body: str

    @property
    def rpc(self) -> Any:
        """The JSON-RPC message of the body, or None."""
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    @property
    def rpc_method(self) -> str | None:
        msg = self.rpc
        return msg.get("method") if isinstance(msg, dict) else None

    @property
    def is_response(self) -> bool:
        """A client's answer to a server-to-client request (result or error, no method)."""
        msg = self.rpc
        return isinstance(msg, dict) and "method" not in msg and (
            "result" in msg or "error" in msg)


def parse_log_line(line: str) -> Served | None:
    """A `Served` from one line of the format in `haproxy_config`, or None for other lines."""
    parts = line.rstrip("\n").split(" ", 6)
    if len(parts) != 7 or parts[0] != LOG_TAG or not parts[5].startswith("sid="):
        return None
    _, server, status, method, path, sid, body = parts
    sid_value = sid.removeprefix("sid=")
    raw = body.removeprefix("body=")
    # the body was json(utf8s)-escaped by HAProxy: unescape it as a JSON string's contents
    text = "" if raw == "-" else json.loads(f'"{raw}"')
    return Served(server, int(status) if status.isdigit() else 0, method, path,
                  None if sid_value == "-" else sid_value, text)


@dataclass
class Cluster:
    replicas: list[Replica]
    lb_port: int
    lb_process: asyncio.subprocess.Process
    lb_log: Path
    prefix: str
    database_url: str
    redis: aioredis.Redis

    @property
    def lb_url(self) -> str:
        return f"http://127.0.0.1:{self.lb_port}"

    @property
    def endpoint(self) -> str:
        """The MCP endpoint through the load balancer."""
        return f"{self.lb_url}/mcp/{ENDPOINT}"

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def other(self, name: str) -> Replica:
        """A replica that is not `name` (with two: the other one)."""
        return next(r for r in self.replicas if r.name != name)

    def requests(self) -> list[Served]:
        """Every request HAProxy has logged so far, in order."""
        text = self.lb_log.read_text(errors="replace") if self.lb_log.exists() else ""
        return [s for s in map(parse_log_line, text.splitlines()) if s is not None]

    def of_session(self, session_id: str | None) -> list[Served]:
        return [s for s in self.requests() if session_id and s.session_id == session_id]

    def servers_of(self, session_id: str | None) -> set[str]:
        """The replicas that served requests of this session through the load balancer."""
        return {s.server for s in self.of_session(session_id)}

    async def logged(self, match: Callable[[Served], bool], what: str) -> Served:
        """The first logged request matching `match`, waiting (with a deadline) for its line."""
        found: list[Served] = []

        def matched() -> bool:
            found[:] = [s for s in self.requests() if match(s)]
            return bool(found)

        await until(matched, DEADLINE_S, f"HAProxy's logging a {what}")
        return found[0]

    async def keys(self) -> dict[str, int]:
        """Every Redis key under the prefix (without it) and its PTTL (-1: no expiry)."""
        found: dict[str, int] = {}
        async for key in self.redis.scan_iter(match=f"{self.prefix}*", count=1000):
            name = key.decode()
            found[name.removeprefix(self.prefix)] = int(await self.redis.pttl(key))
        return found

    async def subscribers(self) -> int:
        """How many connections listen on the cancel channel (one per live replica)."""
        ((_, count),) = await self.redis.pubsub_numsub(f"{self.prefix}cancel")
        return int(count)


def gateway_config(port: int, lb_port: int, upstream_url: str, database_url: str, prefix: str,
                   config: dict[str, Any] | None, upstream: dict[str, Any]) -> dict[str, Any]:
    """One replica's config: its own listen port; everything else shared."""
    tables: dict[str, Any] = {
        "server": {"listen": f"127.0.0.1:{port}", "public_url": f"http://127.0.0.1:{lb_port}",
                   "shutdown_grace_s": 1.0},
        "database": {"url": database_url},
        # 5 s, not the default 1 s: a burst of 1,000 calls on a loaded 2-core machine can keep
        # Redis off the CPU for a second; what these tests check is exactness, not detection
        # time (tests/replicas/test_outage.py and tests/proxy/state/test_state_outage.py set theirs)
        "state": {"url": REDIS_URL, "key_prefix": prefix, "timeout_s": 5.0},
    }
    more = (config or {}).get("upstreams", [])  # beside `up`, each with its own name
    for name, value in (config or {}).items():
        if name == "upstreams":
            continue
        if isinstance(value, dict) and isinstance(tables.get(name), dict):
            tables[name] = {**tables[name], **value}
        else:
            tables[name] = value
    tables["upstreams"] = [{"name": ENDPOINT, "url": f"{upstream_url}/mcp", **upstream}, *more]
    return tables


def haproxy_config(lb_port: int, replicas: list[tuple[str, int]]) -> str:
    """Round-robin over `replicas`, every request balanced on its own, each logged on stdout
    (server, status, method, path, session id, body) as soon as its response starts."""
    servers = "\n".join(
        f"    server {name} 127.0.0.1:{port} check inter 200ms fall 2 rise 1"
        for name, port in replicas)
    return f"""\
global
    log stdout len 16384 format raw local0
    maxconn 8192
    tune.bufsize 65536

defaults
    mode http
    log global
    option logasap
    option http-server-close
    http-reuse never
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout tunnel 120s
    timeout check 2s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response

frontend mcp
    bind 127.0.0.1:{lb_port}
    option http-buffer-request
    http-request set-var(txn.sid) req.hdr(mcp-session-id)
    http-request set-var(txn.body) req.body
    log-format "{LOG_TAG} %s %ST %HM %HP sid=%[var(txn.sid)] body=%[var(txn.body),json(utf8s)]"
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /healthz
{servers}
"""


async def _start_replica(name: str, port: int, tables: dict[str, Any], tmp_path: Path,
                         env: dict[str, str] | None = None) -> Replica:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(toml(tables))
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--config", str(cfg), "--log-level",
            "warning", cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            env=None if env is None else {**os.environ, **env})
    return Replica(name, port, process, log_path)


async def _healthy(replica: Replica, client: httpx.AsyncClient) -> None:
    async def healthy() -> bool:
        if replica.process.returncode is not None:
            raise AssertionError(f"replica {replica.name} exited with "
                                 f"{replica.process.returncode}:\n{replica.output()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            return (await client.get(f"{replica.url}/healthz")).status_code == 200
        return False

    try:
        await until(healthy, START_DEADLINE_S, f"replica {replica.name} being healthy")
    except AssertionError as failed:
        if replica.process.returncode is not None:
            raise  # (it exited: the message has its output)
        raise AssertionError(f"{failed}:\n{replica.output()[-3000:]}") from None


async def _balanced(cluster: Cluster, client: httpx.AsyncClient) -> None:
    """Until HAProxy has sent a request to every replica (its checks found them up)."""
    names = {r.name for r in cluster.replicas}

    async def reached() -> bool:
        if cluster.lb_process.returncode is not None:
            raise AssertionError(f"haproxy exited: {cluster.lb_log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            await client.get(f"{cluster.lb_url}/healthz")
        return names <= {s.server for s in cluster.requests()}

    await until(reached, START_DEADLINE_S, "HAProxy's reaching every replica")


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def delete_keys(redis: aioredis.Redis, prefix: str) -> None:
    doomed = [key async for key in redis.scan_iter(match=f"{prefix}*", count=1000)]
    if doomed:
        await redis.delete(*doomed)


def require_tools() -> None:
    """HAProxy must be installed (.ci/run installs it); fail loudly, never skip."""
    if shutil.which("haproxy") is None:
        raise AssertionError("haproxy is not installed: apt-get install -y haproxy "
                             "(.ci/run does this)")


@contextlib.asynccontextmanager
async def open_cluster(tmp_path: Path, upstream_url: str, *, replicas: int = 2,
                       config: dict[str, Any] | None = None, database_url: str | None = None,
                       env: dict[str, str] | None = None, **upstream: Any
                       ) -> AsyncIterator[Cluster]:
    """`replicas` gateway processes in front of `upstream_url` (endpoint `up`, `upstream` its
    settings, `config` further top-level tables merged over the defaults, its `upstreams`
    added beside `up`) behind HAProxy, on the test's database (or `database_url`, for a
    cluster that outlives one test), with `env` added to the replicas' environment."""
    require_tools()
    prefix = f"tollhouse-replicas:{secrets.token_hex(6)}:"
    database_url = database_url or db_backends.url()
    # the machine's Redis, or the one `config`'s [state] names (an outage test's own)
    redis_url = (config or {}).get("state", {}).get("url", REDIS_URL)
    # a connection broken by an outage test's restart is made afresh, once
    redis = aioredis.Redis.from_url(redis_url, socket_timeout=5, retry=Retry(NoBackoff(), 1),
                                    retry_on_error=[RedisConnectionError])
    lb_port = free_port()
    ports = [(f"r{i}", free_port()) for i in range(replicas)]
    started: list[Replica] = []
    lb_process: asyncio.subprocess.Process | None = None
    try:
        await redis.ping()
        started = list(await asyncio.gather(*(
            _start_replica(name, port, gateway_config(port, lb_port, upstream_url, database_url,
                                                      prefix, config, upstream), tmp_path, env)
            for name, port in ports)))
        lb_cfg = tmp_path / "haproxy.cfg"
        lb_cfg.write_text(haproxy_config(lb_port, ports))
        lb_log = tmp_path / "haproxy.log"
        with lb_log.open("wb") as log:
            lb_process = await asyncio.create_subprocess_exec(
                "haproxy", "-f", str(lb_cfg), "-db", stdin=asyncio.subprocess.DEVNULL,
                stdout=log, stderr=log)
        cluster = Cluster(started, lb_port, lb_process, lb_log, prefix, database_url, redis)
        async with httpx.AsyncClient(timeout=5) as client:
            await asyncio.gather(*(_healthy(r, client) for r in started))

            async def subscribed() -> bool:
                return await cluster.subscribers() >= replicas

            await until(subscribed, START_DEADLINE_S, "every replica's subscribing to cancels")
            await _balanced(cluster, client)
        yield cluster
    finally:
        await asyncio.gather(*(_stop(r.process) for r in started))
        if lb_process is not None:
            await _stop(lb_process)
        await delete_keys(redis, prefix)
        await redis.aclose()
