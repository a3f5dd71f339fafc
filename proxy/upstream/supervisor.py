"""Supervised, confined child processes for stdio upstreams (proxy.upstream.stdio).

A `Child` is one process: started under its keeper (proxy.upstream.keeper: nothing it starts
outlives the gateway), in its own session (process group) with only the configured environment
(plus PATH and HOME, and a person's token for a per_user upstream), resource limits, a working
directory outside the gateway's (`/` unless `cwd` says), and optionally another user; opened with a 2025-11-25 `initialize` within a bounded start-up;
its stdout read line by line (a line that is not a JSON-RPC object is logged and skipped, one
longer than the cap is dropped) and its stderr read continuously, logged under the upstream's
name and bounded. Every request sent to it gets the child's own id (`open_call`), so many
callers share one process without their ids colliding. Stopping kills the whole process group
and reaps the leader. `proxy.upstream.pool` decides when children start and stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.config import UpstreamConfig

log = logging.getLogger("tollhouse.stdio")

PROTOCOL_VERSION = "2025-11-25"
CLIENT_CAPABILITIES = {"sampling": {}, "elicitation": {"form": {}}, "roots": {"listChanged": True}}
STOP_GRACE_S = 2.0  # SIGTERM, then this long, then SIGKILL for the whole group
LOG_LINES_PER_WINDOW = 50  # stderr and skipped stdout lines logged per window, per child
LOG_WINDOW_S = 10.0
LOG_LINE_CAP = 1000  # characters of one logged line
QUEUE_CAP = 10_000  # notifications waiting for one caller before more are dropped

EXITED = object()  # on a call's queue: the process ended before it answered
KEEPER = str(Path(__file__).with_name("keeper.py"))


class Unavailable(Exception):
    """No process to send to now (starting failed, backing off, all busy); the text says why,
    for the gateway's log."""


class Busy(Unavailable):
    """per_user: every one of max_processes has a call in flight (no backoff follows)."""


@dataclass(frozen=True, slots=True)
class Spec:
    """What starting a process needs, read once from the upstream's config."""

    name: str
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str | None
    per_user: bool
    max_processes: int
    idle_stop_s: float
    start_timeout_s: float
    token_env: str
    run_as: str
    memory_limit_mb: int
    open_files_limit: int
    cpu_limit_s: int
    max_line_bytes: int

    @classmethod
    def from_config(cls, cfg: UpstreamConfig) -> Spec:
        return cls(cfg.name, cfg.command, tuple(cfg.args), tuple(cfg.env.items()),
                   cfg.cwd or None, cfg.process == "per_user", cfg.max_processes,
                   cfg.idle_stop_s, cfg.start_timeout_s, cfg.token_env, cfg.run_as,
                   cfg.memory_limit_mb, cfg.open_files_limit, cfg.cpu_limit_s,
                   cfg.max_line_bytes)

    def environment(self, token: str | None) -> dict[str, str]:
        """Only what the operator configured, PATH and HOME: never the gateway's secrets."""
        home = os.environ.get("HOME", "/")
        if self.run_as:
            with contextlib.suppress(KeyError):
                home = pwd.getpwnam(self.run_as).pw_dir
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, **dict(self.env)}
        if self.token_env and token is not None:
            env[self.token_env] = token
        return env

    def limits(self) -> Callable[[], None]:
        """Run in the child before exec: its resource limits."""
        memory = self.memory_limit_mb * 1024 * 1024
        files, cpu = self.open_files_limit, self.cpu_limit_s

        def apply() -> None:
            import resource

            if memory:  # the data segment, not the address space: V8 reserves far more
                resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
            if files:
                resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
            if cpu:
                resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))

        return apply


@dataclass(slots=True, eq=False)
class Call:
    """One caller's request in flight on a child: the child's id for it, the caller's session,
    person and own id and progress token, and the queue of what the child sends for it."""

    child_id: int
    session: str
    caller_id: Any
    person: str = ""  # the principal's key: only they (on `session`) may answer its asks
    progress_token: Any = None
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    dropped: int = 0

    def put(self, message: Any) -> None:
        if message is not EXITED and "id" not in message and self.queue.qsize() >= QUEUE_CAP:
            self.dropped += 1  # a flood of notifications: bounded, the answer still comes
            return
        self.queue.put_nowait(message)


class _Bounded:
    """A log of a child's lines that says at most LOG_LINES_PER_WINDOW per window."""

    def __init__(self, name: str, what: str) -> None:
        self._name, self._what = name, what
        self._window = 0.0
        self._count = 0
        self._suppressed = 0

    def line(self, text: str) -> None:
        now = time.monotonic()
        if now - self._window >= LOG_WINDOW_S:
            if self._suppressed:
                log.warning("stdio upstream %s: %d %s lines not logged", self._name,
                            self._suppressed, self._what)
            self._window, self._count, self._suppressed = now, 0, 0
        self._count += 1
        if self._count > LOG_LINES_PER_WINDOW:
            self._suppressed += 1
            return
        log.info("stdio upstream %s %s: %s", self._name, self._what, text[:LOG_LINE_CAP])


Deliver = Callable[["Child", dict[str, Any]], None]


class Child:
    """One process of a stdio upstream (see the module docstring)."""

    def __init__(self, spec: Spec, key: str, token: str | None, deliver: Deliver,
                 exited: Callable[[Child], None]) -> None:
        self.spec, self.key, self.token = spec, key, token
        self._deliver, self._exited = deliver, exited
        self.proc: asyncio.subprocess.Process | None = None
        self.calls: dict[int, Call] = {}
        self.progress: dict[str, Call] = {}
        self.initialize_result: dict[str, Any] = {}
        self.started_at = time.monotonic()
        self.last_used = self.started_at
        self.stopping = False
        self.retiring = False  # a per_user child whose token was refreshed: stops when idle
        self._next_id = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stdout_log = _Bounded(spec.name, "stdout (not JSON-RPC, skipped)")
        self._stderr_log = _Bounded(spec.name, "stderr")
        self.done = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> None:
        """Spawn, read, and open with `initialize`; raise Unavailable on any failure (the
        process, if any, is stopped)."""
        spec = self.spec
        try:
            user = pwd.getpwnam(spec.run_as) if spec.run_as else None
            ids = (str(user.pw_uid), str(user.pw_gid)) if user else ("-1", "-1")
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", KEEPER, str(os.getpid()), *ids, spec.command,
                *spec.args, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=spec.environment(self.token), cwd=spec.cwd or "/", start_new_session=True,
                preexec_fn=spec.limits(), limit=spec.max_line_bytes)
        except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"cannot start {spec.command!r}: {exc}") from None
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_stdout()),
                       loop.create_task(self._read_stderr()),
                       loop.create_task(self._reap_group())]
        try:
            result = await asyncio.wait_for(self._initialize(), spec.start_timeout_s)
        except TimeoutError:
            await self.stop()
            raise Unavailable(f"no initialize answer within {spec.start_timeout_s:g} s") \
                from None
        except Unavailable:
            await self.stop()
            raise
        self.initialize_result = result

    async def _initialize(self) -> dict[str, Any]:
        call = self.open_call("", 0)
        await self.send({"jsonrpc": "2.0", "id": call.child_id, "method": "initialize",
                         "params": {"protocolVersion": PROTOCOL_VERSION,
                                    "capabilities": CLIENT_CAPABILITIES,
                                    "clientInfo": {"name": "tollhouse", "version": "1"}}})
        while True:
            message = await call.queue.get()
            if message is EXITED:
                raise Unavailable("the process exited during initialize")
            if "id" in message and message.get("id") == 0 and "method" not in message:
                break
        self.close_call(call)
        result = message.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("protocolVersion"), str):
            raise Unavailable("the process refused initialize")
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    def open_call(self, session: str, caller_id: Any, person: str = "") -> Call:
        child_id = self._next_id
        self._next_id += 1
        call = Call(child_id, session, caller_id, person)
        self.calls[child_id] = call
        self.last_used = time.monotonic()
        return call

    def close_call(self, call: Call) -> None:
        self.calls.pop(call.child_id, None)
        if call.progress_token is not None:
            self.progress.pop(f"p{call.child_id}", None)
        if call.dropped:
            log.warning("stdio upstream %s: %d notifications for one call dropped (flood)",
                        self.spec.name, call.dropped)
        self.last_used = time.monotonic()

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_line(orjson.dumps(message))

    async def send_line(self, line: bytes) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or self.done.is_set():
            raise Unavailable("the process is not running")
        try:
            proc.stdin.write(line + b"\n")
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise Unavailable(f"cannot write to the process: {exc}") from None

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        out = self.proc.stdout
        try:
            while True:
                try:
                    line = await out.readline()
                except ValueError as exc:  # longer than the cap: dropped, up to its end
                    self._stdout_log.line(f"a line over {self.spec.max_line_bytes} bytes")
                    if "not found" in str(exc):  # only its start was read (and discarded)
                        await _skip_line(out)
                    continue
                if not line:
                    break
                self._line(line)
        except (ConnectionError, OSError):
            pass
        finally:
            await self._ended()

    def _line(self, line: bytes) -> None:
        stripped = line.strip()
        if not stripped:
            return
        try:
            message = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            message = None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self._stdout_log.line(stripped.decode("utf-8", "replace"))
            return
        self.last_used = time.monotonic()
        self._deliver(self, message)

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        err = self.proc.stderr
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                try:
                    line = await err.readline()
                except ValueError as exc:
                    if "not found" in str(exc):
                        await _skip_line(err)
                    continue
                if not line:
                    return
                text = line.decode("utf-8", "replace").rstrip()
                if text:
                    self._stderr_log.line(text)

    async def _reap_group(self) -> None:
        """The leader exited: what is left of its group goes too, so a member that still
        holds stdout open cannot hide the exit (its pipes close with it)."""
        assert self.proc is not None
        await self.proc.wait()
        _kill_group(self.proc, signal.SIGKILL)

    async def _ended(self) -> None:
        """stdout closed: the process is ending. Every call waiting on it learns so."""
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            _kill_group(proc, signal.SIGKILL)
            if proc.returncode is None:
                await proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        calls, self.calls = list(self.calls.values()), {}
        self.progress.clear()
        for call in calls:
            call.put(EXITED)
        if not self.stopping:
            log.warning("stdio upstream %s: process %s exited (status %s)", self.spec.name,
                        self.pid, proc.returncode if proc is not None else None)
        self.done.set()
        self._exited(self)

    async def stop(self) -> None:
        """The whole process group: SIGTERM, a grace, SIGKILL; reaped, pipes closed."""
        self.stopping = True
        proc = self.proc
        if proc is None:
            self.done.set()
            return
        if proc.stdin is not None:
            proc.stdin.close()
        _kill_group(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.done.wait(), STOP_GRACE_S)
        except TimeoutError:
            _kill_group(proc, signal.SIGKILL)
            await self.done.wait()
        for task in self._tasks:
            await asyncio.wait({task}, timeout=STOP_GRACE_S)
        transport = getattr(proc, "_transport", None)  # every pipe's descriptor, now
        if transport is not None:
            transport.close()


def _kill_group(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # start_new_session: the group's id is the leader's pid


async def _skip_line(stream: asyncio.StreamReader) -> None:
    while True:
        try:
            await stream.readuntil(b"\n")
            return
        except asyncio.LimitOverrunError as exc:
            await stream.readexactly(exc.consumed)
        except asyncio.IncompleteReadError:
            return
