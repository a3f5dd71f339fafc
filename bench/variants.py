"""Tollhouse targets: one per state backend × workers × replicas, each with its own config.

A variant is `tollhouse[<state>]` (one process), `tollhouse[<state>,w<N>]` (one `tollhouse
serve` with `[server] workers = N`) or `tollhouse[<state>,<N>xhaproxy]` (N separate
processes on one Redis behind HAProxy, `balance roundrobin`: the two-replica deployment).

`--stateful` gives every variant the same config that puts each per-call store on the hot
path, so memory and Redis do the same work and differ only in where it goes: a JWT caller
(HS256; the lockout check of the caller's address runs before and after each credential), a
2025-11-25 session (one `initialize`, then every call sends its `Mcp-Session-Id`: a session
lookup per call) and a rate-limit rule whose burst no run can exhaust (the limiter's script
runs on every call, none is refused). Without it the config is the plain one of `run.py`
(anonymous, sessionless, no limit), which leaves a Redis store nothing to do per call.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import cpu
from procs import PROBE_HEADERS, Processes, Server, free_port, wait_ready

ISSUER = "https://issuer.bench.invalid/"
AUDIENCE = "tollhouse-bench"
SUBJECT = "bench-user"

BASE_TOML = """\
[server]
listen = "127.0.0.1:{port}"
public_url = "{public_url}"
workers = {workers}
[database]
url = "sqlite:///{dbdir}/bench.db"
[state]
url = "{state_url}"
key_prefix = "{key_prefix}"
[[upstreams]]
name = "bench"
url = "http://127.0.0.1:{stub_port}/mcp"
era = "legacy"
"""
PLAIN_AUTH = """\
[auth]
mode = "none"
"""
# the bench issuer's HS256 tokens (bearer()); paths.py and soak.py use it too
JWT_AUTH = """\
[auth]
mode = "jwt"
[[auth.issuers]]
issuer = "{issuer}"
hs256_secret = "{secret}"
algorithms = ["HS256"]
audience = "{audience}"
"""
STATEFUL_AUTH = JWT_AUTH + """\
[[rate_limits]]
name = "bench-unreachable"
key = "principal"
methods = ["tools/call"]
rate = "1000000/s"
burst = 1000000000
"""
HAPROXY_CFG = """\
global
    maxconn 4096
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
frontend bench
    bind 127.0.0.1:{port}
    default_backend gateways
backend gateways
    balance roundrobin
    http-reuse always
{servers}
"""


@dataclass(frozen=True)
class Variant:
    state: str  # "memory" or "redis"
    workers: int = 1
    replicas: int = 0  # 0: the gateway itself is the target; N: N processes behind HAProxy

    @property
    def name(self) -> str:
        parts = [self.state]
        if self.workers > 1:
            parts.append(f"w{self.workers}")
        if self.replicas:
            parts.append(f"{self.replicas}xhaproxy")
        return f"tollhouse[{','.join(parts)}]"

    @property
    def slug(self) -> str:
        return self.name.removeprefix("tollhouse[").rstrip("]").replace(",", "-")


@dataclass(frozen=True)
class Settings:
    exe: str
    tmpdir: Path
    stub_port: int
    redis_url: str
    run_prefix: str  # every Redis key of this run starts with it (deleted at the end)
    stateful: bool
    secret: str = ""


def plan(states: list[str], workers: list[int], replicas: list[int]) -> tuple[list[Variant], list[str]]:
    """Every valid combination, and a note for each one left out (more than one process
    needs a shared state)."""
    variants: list[Variant] = []
    notes: list[str] = []
    for state in states:
        for w in workers:
            if w > 1 and state == "memory":
                notes.append(f"tollhouse[memory,w{w}] not run: more than one worker needs a shared state")
                continue
            variants.append(Variant(state, w))
        for r in replicas:
            if state == "memory" and r > 1:
                notes.append(f"tollhouse[memory,{r}xhaproxy] not run: replicas need a shared state")
                continue
            variants.append(Variant(state, 1, r))
    return variants, notes


def config_text(v: Variant, s: Settings, port: int, public_url: str, dbdir: Path) -> str:
    state_url = s.redis_url if v.state == "redis" else "memory"
    text = BASE_TOML.format(port=port, public_url=public_url, workers=v.workers, dbdir=dbdir,
                            state_url=state_url, key_prefix=f"{s.run_prefix}{v.slug}:",
                            stub_port=s.stub_port)
    if s.stateful:
        return text + STATEFUL_AUTH.format(issuer=ISSUER, secret=s.secret, audience=AUDIENCE)
    return text + PLAIN_AUTH


def bearer(secret: str) -> str:
    """An HS256 token from the bench issuer, valid for a day (verified once, then cached by
    the gateway, as a real client's token is)."""
    import jwt  # the gateway's venv has it

    now = int(time.time())
    token = jwt.encode({"iss": ISSUER, "sub": SUBJECT, "aud": AUDIENCE, "iat": now,
                        "exp": now + 86400}, secret, algorithm="HS256")
    return f"Bearer {token}"


def start(procs: Processes, v: Variant, s: Settings) -> Server | str:
    """The started variant (its URL, headers and CPU groups filled), or a note why not."""
    path = shutil.which(s.exe)
    if path is None:
        return f"{v.name} skipped: `{s.exe}` is not installed."
    own = s.tmpdir / v.slug
    own.mkdir(exist_ok=True)
    try:
        if v.replicas:
            server = _behind_haproxy(procs, v, s, path, own)
        else:
            server = _gateway(procs, v, s, path, own, v.name, free_port(), None)
            if v.workers > 1:
                _wait_workers(server, v.workers)
    except RuntimeError as exc:
        return f"{v.name} skipped: {exc}"
    if s.stateful:
        try:
            server.headers = _session_headers(server.url, bearer(s.secret))
        except (OSError, RuntimeError) as exc:
            return f"{v.name} skipped: no session: {exc}"
    return server


def _gateway(procs: Processes, v: Variant, s: Settings, path: str, own: Path, name: str,
             port: int, public_url: str | None) -> Server:
    config = own / f"{name}.toml"
    config.write_text(config_text(v, s, port, public_url or f"http://127.0.0.1:{port}", own))
    server = procs.start(name, [path, "serve", "--config", str(config)], port, "/mcp/bench")
    try:
        wait_ready(server, deadline_s=30.0)
    except RuntimeError:
        procs.stop(server)
        raise
    return server


def _wait_workers(server: Server, workers: int, deadline_s: float = 20.0) -> None:
    """`server.workers` forks worker processes (same process group): wait until there are at
    least that many, so that a build whose CLI ignores the key is not reported as two."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if cpu.group_size(server.proc.pid) >= workers + 1:  # the parent and its workers
            return
        time.sleep(0.1)  # poll interval, not a readiness wait
    raise RuntimeError(f"`tollhouse serve` runs {cpu.group_size(server.proc.pid)} process(es) "
                       f"with server.workers = {workers}: this build does not fork workers yet")


def _behind_haproxy(procs: Processes, v: Variant, s: Settings, path: str, own: Path) -> Server:
    if shutil.which("haproxy") is None:
        raise RuntimeError("haproxy is not installed (apt-get install -y haproxy)")
    lb_port = free_port()
    public_url = f"http://127.0.0.1:{lb_port}"
    replicas = [_gateway(procs, v, s, path, own, f"{v.name}#{i}", free_port(), public_url)
                for i in range(v.replicas)]
    cfg = own / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.format(port=lb_port, servers="\n".join(
        f"    server r{i} 127.0.0.1:{r.port}" for i, r in enumerate(replicas))))
    lb = procs.start(v.name, ["haproxy", "-db", "-f", str(cfg)], lb_port, "/mcp/bench")
    wait_ready(lb)
    lb.groups = [r.proc.pid for r in replicas]
    lb.lb_groups = [lb.proc.pid]
    return lb


def _post(url: str, body: dict[str, object], headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={**PROBE_HEADERS, **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {}, exc.read()


def _session_headers(url: str, authorization: str) -> dict[str, str]:
    """One initialize (and notifications/initialized): the headers every call then sends."""
    auth = {"authorization": authorization}
    status, headers, body = _post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "tollhouse-bench", "version": "1"}}}, auth)
    session = headers.get("mcp-session-id")
    if status != 200 or not session:
        raise RuntimeError(f"initialize answered {status}: {body[:200]!r}")
    with_session = {**auth, "mcp-session-id": session}
    status, _, body = _post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, with_session)
    if status != 202:
        raise RuntimeError(f"notifications/initialized answered {status}: {body[:200]!r}")
    return with_session


def delete_keys(redis_url: str, prefix: str) -> int:
    """SCAN MATCH prefix* + DEL: what this run left in Redis. The number of keys deleted."""
    import redis  # the gateway's venv has it

    client = redis.Redis.from_url(redis_url)
    deleted = 0
    with contextlib.closing(client):
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.delete(*batch))
                batch.clear()
        if batch:
            deleted += int(client.delete(*batch))
    return deleted


def new_prefix() -> str:
    return f"bench{secrets.token_hex(6)}:"
