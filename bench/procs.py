"""Start, probe and stop the benchmark's server subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROBE_BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
PROBE_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                 "MCP-Protocol-Version": "2025-11-25"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    url: str = field(default="")
    headers: dict[str, str] = field(default_factory=dict)  # sent on every request (wrk, probe)
    body: bytes | None = None  # every request's body (wrk, probe); None: PROBE_BODY
    # process groups whose CPU is this target's (empty: its own); a load balancer's apart
    groups: list[int] = field(default_factory=list)
    lb_groups: list[int] = field(default_factory=list)

    @property
    def cpu_groups(self) -> list[int]:
        return self.groups or [self.proc.pid]

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Processes:
    """Owns every process it starts; ``stop_all`` kills each one's process group."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.servers: list[Server] = []

    def start(self, name: str, cmd: Sequence[str], port: int, path: str, cpus: set[int] | None = None,
              pythonpath: Path | None = None) -> Server:
        log = self.logdir / f"{name}.log"
        env = None
        if pythonpath is not None:  # a module the process imports by name (a metering hook)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(pythonpath), os.environ.get("PYTHONPATH", "")) if p)}
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        server = Server(name, port, proc, log, f"http://127.0.0.1:{port}{path}")
        self.servers.append(server)
        if cpus:
            os.sched_setaffinity(proc.pid, cpus)
        return server

    def stop(self, server: Server, grace_s: float = 5.0) -> None:
        if server.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGTERM)
            try:
                server.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.proc.pid, signal.SIGKILL)
                server.proc.wait(timeout=grace_s)
        if server in self.servers:
            self.servers.remove(server)

    def start_stub(self, cpus: set[int] | None = None) -> Server:
        """The upstream stub (bench/stub.py) on a free port, answering."""
        port = free_port()
        server = self.start("stub", [sys.executable, str(Path(__file__).resolve().parent / "stub.py"),
                                     "--port", str(port)], port, "/mcp", cpus)
        wait_ready(server)
        return server

    def stop_all(self) -> None:
        for server in list(reversed(self.servers)):
            self.stop(server)


def wait_ready(server: Server, deadline_s: float = 20.0) -> None:
    """Poll a TCP connect until it succeeds; raise if the process dies or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with code {server.proc.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=0.5):
            return
        time.sleep(0.05)  # poll interval, not a readiness wait
    raise RuntimeError(f"{server.name} not listening on port {server.port} after {deadline_s:g} s:\n"
                       f"{server.log_tail()}")


def probe(url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None,
          body: bytes | None = None) -> tuple[int, str]:
    """POST one tools/call (`body`, default PROBE_BODY); (status, start of body)."""
    req = urllib.request.Request(url, data=body or PROBE_BODY,
                                 headers={**PROBE_HEADERS, **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(300).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(300).decode(errors="replace")
