"""Tollhouse targets by request path: what the gateway does per call, each its own target in
the same interleaved rounds, set side by side against `auth-off` (and against the stub, the
upstream called directly).

| path | client | upstream | what is on the call's path |
|---|---|---|---|
| `auth-off` | 2025-11-25, sessionless | legacy | nothing: anonymous, no policy (the floor) |
| `all-policies` | 2025-11-25, sessionless | legacy | a JWT caller (HS256), an access rule and a group's tool profile, a rate limit that never refuses, egress zones, an in-process metering hook (authorize and record), audit and usage events to SQLite |
| `modern` | 2026-07-28, sessionless | 2026-07-28 | the per-request envelope and its headers |
| `bridged` | 2026-07-28 | legacy | the era bridge: one held upstream session for the caller |
| `sse` | 2025-11-25 | legacy, answering as `text/event-stream` | the SSE relay |
| `64k` | 2025-11-25 | legacy, a 64 KiB text result | a large answer |
| `no-metering` | as all-policies | legacy | every policy of all-policies but the metering hook (no usage events): what the rest of the chain costs |
| `metered` | as auth-off | legacy | auth-off plus the metering hook (authorize, and each usage event handed to it as the call ends): what metering costs alone |
| `all-but-access`, `all-but-rate-limit`, `all-but-egress` | as all-policies | legacy | all-policies without that one part: what it costs among the others |
| `auth-off-uvloop`, `all-policies-uvloop` | | | the same two paths with `server.event_loop = "uvloop"`, each also set against its asyncio twin |

Every path but the policy ones runs the `auth-off` config with its own upstream era, tool and
request; each gets its own config file and SQLite database.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from procs import Processes, Server, free_port, wait_ready
from variants import JWT_AUTH

MODERN = "2026-07-28"
ISSUER = "https://issuer.bench.invalid/"
AUDIENCE = "tollhouse-bench"
SUBJECT = "bench-user"
BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Path_:
    name: str
    era: str  # the upstream's `era` in the config
    tool: str  # what the stub answers: echo (JSON), sse (one SSE event), big (64 KiB)
    modern_client: bool
    policies: bool = False
    metered: bool | None = None  # the metering hook on; None: with the policies
    loop: str = "asyncio"  # server.event_loop
    without: str = ""  # one part of all-policies left out: access, rate-limit or egress

    @property
    def metering(self) -> bool:
        return self.policies if self.metered is None else self.metered

    def body(self) -> bytes:
        params: dict[str, object] = {"name": self.tool, "arguments": {"text": "hello"}}
        if self.modern_client:
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                               "io.modelcontextprotocol/clientCapabilities": {},
                               "io.modelcontextprotocol/clientInfo": {"name": "tollhouse-bench",
                                                                      "version": "1"}}
        return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
                          separators=(",", ":")).encode()

    def headers(self) -> dict[str, str]:
        if not self.modern_client:
            return {}
        return {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": self.tool}


PATHS = {p.name: p for p in (
    Path_("auth-off", "legacy", "echo", False),
    Path_("all-policies", "legacy", "echo", False, policies=True),
    Path_("modern", "modern", "echo", True),
    Path_("bridged", "legacy", "echo", True),
    Path_("sse", "legacy", "sse", False),
    Path_("64k", "legacy", "big", False),
    Path_("no-metering", "legacy", "echo", False, policies=True, metered=False),
    Path_("metered", "legacy", "echo", False, metered=True),
    *(Path_(f"all-but-{part}", "legacy", "echo", False, policies=True, without=part)
      for part in ("access", "rate-limit", "egress")),
    Path_("auth-off-uvloop", "legacy", "echo", False, loop="uvloop"),
    Path_("all-policies-uvloop", "legacy", "echo", False, policies=True, loop="uvloop"),
)}

BASE = """\
[server]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
event_loop = "{loop}"
[database]
url = "sqlite:///{dbdir}/bench.db"
[[upstreams]]
name = "bench"
url = "http://127.0.0.1:{stub_port}/mcp"
era = "{era}"
"""
AUTH_OFF = """\
[auth]
mode = "none"
"""
# every policy of the chain on one call: identity, access and a tool profile, a rate limit,
# egress zones, metering before and after; audit and usage events go to SQLite. By part, so
# that a path can leave one out (`all-but-<part>`); the upstream's keys come first.
EGRESS_UPSTREAM = """\
zones = ["loopback"]
collections = ["bench-data"]
"""
ACCESS = """\
[upstreams.access]
allow_subjects = ["{subject}"]
tools_allow = ["echo", "sse", "big"]
tools_deny = ["admin_*"]
[upstreams.access.group_tools.eng]
tools_allow = ["deploy_*"]
"""
RATE_LIMIT = """\
[[rate_limits]]
name = "bench-unreachable"
key = "principal_tool"
methods = ["tools/call"]
rate = "1000000/s"
burst = 1000000000
"""
EGRESS = """\
[egress.collections]
bench-data = "local_only"
"""
ALL_POLICIES = EGRESS_UPSTREAM + ACCESS + JWT_AUTH + RATE_LIMIT + EGRESS


def policies_text(without: str = "") -> str:
    """ALL_POLICIES, or it without one part."""
    parts = {"egress-upstream": EGRESS_UPSTREAM, "access": ACCESS, "jwt": JWT_AUTH,
             "rate-limit": RATE_LIMIT, "egress": EGRESS}
    if without == "egress":
        del parts["egress-upstream"]
    if without:
        del parts[without]
    return "".join(parts.values())


METERING = """\
[metering]
hook = "meter_hook:HOOK"
methods = ["tools/call"]
"""


def config_text(path: Path_, port: int, stub_port: int, dbdir: Path, secret: str,
                database: str = "", server: str = "") -> str:
    """The path's config; `database` and `server`: more lines of its [database] and [server]
    tables (bench/threads.py)."""
    text = BASE.format(port=port, dbdir=dbdir, stub_port=stub_port, era=path.era,
                       loop=path.loop)
    if database:
        text = text.replace("[database]\n", f"[database]\n{database}\n", 1)
    if server:
        text = text.replace("[server]\n", f"[server]\n{server}\n", 1)
    if path.policies:
        text += policies_text(path.without).format(subject=SUBJECT, issuer=ISSUER,
                                                   secret=secret, audience=AUDIENCE)
    else:
        text += AUTH_OFF
    return text + METERING if path.metering else text


def bearer(secret: str) -> str:
    import jwt  # the gateway's venv has it

    now = int(time.time())
    token = jwt.encode({"iss": ISSUER, "sub": SUBJECT, "aud": AUDIENCE, "iat": now,
                        "exp": now + 86400}, secret, algorithm="HS256")
    return f"Bearer {token}"


def start(procs: Processes, path: Path_, exe: str, tmpdir: Path, stub_port: int,
          prefix: str = "tollhouse", database: str = "", server_lines: str = "",
          launcher: Sequence[str] = (), ready_s: float = 30.0) -> Server | str:
    """The started target `<prefix>{<path>}` (`tollhouse-compare` for run.py's --compare
    build), or a note why not. `launcher`: a command that takes `serve --config ...` in
    place of `exe` (bench/gcstats.py, valgrind in bench/instructions.py), which may need
    longer than 30 s to listen (`ready_s`)."""
    name = f"{prefix}{{{path.name}}}"
    found = shutil.which(exe)
    if found is None:
        return f"{name} skipped: `{exe}` is not installed."
    own = tmpdir / f"{prefix}-path-{path.name}"
    own.mkdir(exist_ok=True)
    secret = secrets.token_hex(32)
    port = free_port()
    config = own / "tollhouse.toml"
    config.write_text(config_text(path, port, stub_port, own, secret, database, server_lines))
    # the metering hook is a module of bench/, imported by name
    server = procs.start(name, [*(launcher or [found]), "serve", "--config", str(config)], port,
                         "/mcp/bench", pythonpath=BENCH_DIR)
    try:
        wait_ready(server, deadline_s=ready_s)
    except RuntimeError as exc:
        procs.stop(server)
        return f"{name} skipped: it did not start. {exc}"
    server.body = path.body()
    server.headers = path.headers()
    if path.policies:
        server.headers["authorization"] = bearer(secret)
    return server


def comparisons(started: list[str]) -> list[tuple[str, str, str]]:
    """Each path against auth-off, when both ran; with a --compare build, each of its paths
    against the same path of the first build too."""
    pairs = []
    for prefix in ("tollhouse", "tollhouse-compare"):
        base = f"{prefix}{{auth-off}}"
        if base in started:
            pairs += [(f"{prefix}: {n.removeprefix(prefix + '{').rstrip('}')} vs auth-off",
                       base, n)
                      for n in started if n.startswith(prefix + "{") and n != base]
    pairs += [(f"{n.removeprefix('tollhouse{').rstrip('}')} vs asyncio",
               n.replace("-uvloop}", "}"), n)
              for n in started if n.startswith("tollhouse{") and n.endswith("-uvloop}")
              and n.replace("-uvloop}", "}") in started]
    pairs += [(f"compare vs first build: {n.removeprefix('tollhouse-compare{').rstrip('}')}",
               "tollhouse" + n.removeprefix("tollhouse-compare"), n)
              for n in started if n.startswith("tollhouse-compare{")
              and "tollhouse" + n.removeprefix("tollhouse-compare") in started]
    return pairs


if __name__ == "__main__":  # pragma: no cover - a listing for the README
    for p in PATHS.values():
        sys.stdout.write(f"{p.name}: {p.body().decode()[:80]} {p.headers()}\n")
