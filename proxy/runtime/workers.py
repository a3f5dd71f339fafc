"""`[server] workers` > 1: one `tollhouse serve` as a supervisor and N worker processes on one
listen socket.

The supervisor (the process the operator started) binds the listen address once, brings the
database schema up to date once, then starts the workers: fresh interpreters
(`python -m proxy.runtime.workers`, not a fork) that inherit the listening socket's descriptor
(`pass_fds`) and each build their own app, Redis client and event loop, then serve Hypercorn
on `fd://N`. The kernel hands each new connection to whichever worker accepts it first; every
request of a session may land on any worker, which is why more than one worker needs the shared
(`[state] url = "redis://..."`) store.

Why exec and not fork: nothing of the supervisor (threads, a Redis connection, an event loop,
pooled database connections) can leak into a worker half-initialised, and a restarted worker
starts exactly like the first ones. A worker does not read the config file at start: the
supervisor sends it the config it checked (pickled on the worker's stdin, with the file's path
and the environment `serve` started with, secrets included, never logged), so a worker
restarted after the file was edited still matches its siblings. A worker's own environment is
the supervisor's os.environ, which no longer holds a secret (`confine.Environment`): a worker
reads its secrets and, on a reload, the file's `${VAR}`s from the copy it was sent. SIGHUP to
the supervisor checks the file once (a broken one is one log line, and nothing is forwarded),
keeps the result for the workers it starts later, and forwards SIGHUP to every worker that
serves (one still starting gets it once it serves); each worker then re-reads the file and
applies it to its next call (`Serving.reload`).

Supervision:
- The first worker starts alone; the others only once it serves. A first worker that exits
  before serving ends `serve` with its exit status (a config error only a built app can see,
  such as a TOLLHOUSE_SECRET_KEY that does not open the stored signing keys, stays the one
  line and exit 2 it is with one worker).
- SIGTERM or SIGINT to the supervisor: it closes its copy of the socket, forwards SIGTERM to
  every worker, and waits. Each worker drains (`Serving.drain`: new calls refused with 503,
  calls in flight given up to `server.shutdown_grace_s`, then the audit queue and the usage
  outbox flushed) and exits; the supervisor then exits 0. A
  worker still alive 2 x shutdown_grace_s + 10 s later is killed (SIGKILL; exit 1).
- A worker that exits while not asked to is logged (its pid, exit code or signal) and
  restarted: at the earliest 1 s after it was last started, and, while it keeps dying within
  30 s of starting, after 1, 2, 4 ... up to 30 s, so a crash loop runs at most once a second
  and soon much slower.
- The supervisor killed outright (SIGKILL) leaves no orphans: on Linux each worker asks the
  kernel for SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG), so it drains and exits
  as on a normal stop; elsewhere a thread polls getppid() every second to the same end.

Each worker's log lines start `worker=N pid=P`. Metrics: the supervisor makes one directory
per run for prometheus-client's multiprocess mode (`PROMETHEUS_MULTIPROC_DIR` in each worker's
environment), marks a dead worker's live gauges gone, and removes the directory at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import pickle
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from prometheus_client.multiprocess import mark_process_dead

from proxy import confine
from proxy.config import Config
from proxy.confine import Environment
from proxy.observability.metrics import MULTIPROC_ENV

log = logging.getLogger("tollhouse.workers")

BACKLOG = 100  # Hypercorn's own default, as when it binds the address itself
RESTART_MIN_S = 1.0  # a worker is started at most once a second
RESTART_MAX_S = 30.0
STABLE_S = 30.0  # a worker that served this long before dying is restarted after RESTART_MIN_S
PARENT_POLL_S = 1.0  # where PR_SET_PDEATHSIG does not exist
_PR_SET_PDEATHSIG = 1


def listen_socket(listen: str) -> socket.socket:
    """The listening socket for `server.listen`, bound as Hypercorn binds `HOST:PORT`
    (SO_REUSEADDR; IPv6 when the host has a colon). Raises OSError (address taken...)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def address(sock: socket.socket) -> str:
    """`HOST:PORT` of a bound socket: the real port when the config said 0."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------------------------------
# The supervisor


@dataclass
class _Slot:
    """Worker number `index` (1-based) and the process now running as it, if any."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None  # the read end of the pipe the worker says "serving" on
    started: float = 0.0
    serving: bool = False
    failures: int = 0  # deaths in a row, each within STABLE_S of starting
    config: Config | None = None  # the config it was started with or last told to reload
    due: float | None = None  # when a dead worker is restarted

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0


@dataclass
class Supervisor:
    """Starts, watches and stops the workers; `run()` is `tollhouse serve`'s exit status."""

    cfg: Config
    config_path: Path  # the file SIGHUP re-reads
    sock: socket.socket
    log_level: str
    announce: Callable[[], None]  # the one "listening" line, once the first worker serves
    clock: Callable[[], float] = time.monotonic
    # the environment serve started with: the file's ${VAR}s and the workers' secrets
    env: Environment = field(default_factory=lambda: Environment(os.environ))
    slots: list[_Slot] = field(default_factory=list)
    stopping: bool = False
    unclean: bool = False  # a worker stopped by an error or a kill, not by draining
    last_exit: tuple[int, str] = (0, "")  # the last worker's exit code, and in words
    _selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    _signals: list[int] = field(default_factory=list)
    _hangups: int = 0
    _wake_r: int = -1
    _wake_w: int = -1
    metrics_dir: str = ""  # this run's prometheus multiprocess directory (proxy.observability)

    @property
    def base_dir(self) -> Path:
        return self.config_path.parent

    def run(self) -> int:
        self.slots = [_Slot(i + 1) for i in range(self.cfg.server.workers)]
        # every worker writes its metric values here, so a scrape on any one reports them all
        self.metrics_dir = tempfile.mkdtemp(prefix="tollhouse-metrics-")
        previous = self._install_signals()
        try:
            first = self.slots[0]
            self._start(first)
            status = self._wait_first(first)
            if status is not None:
                return status
            self.announce()
            for slot in self.slots[1:]:
                if not self.stopping:
                    self._start(slot)
            while not self.stopping:
                self._step(self._timeout())
            return self._stop()
        finally:
            self._restore_signals(previous)
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    # -- signals ----------------------------------------------------------------------------

    def _install_signals(self) -> dict[int, object]:
        """SIGTERM/SIGINT stop, SIGHUP reloads, SIGCHLD reaps; each wakes the select loop (a
        wakeup fd)."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        previous: dict[int, object] = {}
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            previous[sig] = signal.signal(sig, self._on_signal)
        previous[-1] = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        return previous

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._hangups += 1
        elif signum != signal.SIGCHLD:
            self._signals.append(signum)

    def _restore_signals(self, previous: dict[int, object]) -> None:
        signal.set_wakeup_fd(int(previous.pop(-1)))  # type: ignore[call-overload]
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        for slot in self.slots:
            self._forget_ready(slot)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _take_signals(self) -> None:
        if self._hangups:
            self._hangups = 0
            if not self.stopping:
                self._reload()
        first, self._signals = self._signals[:1], []
        if first and not self.stopping:  # a second signal while stopping changes nothing
            name = signal.Signals(first[0]).name
            log.info("%s: stopping %d worker(s); each finishes its calls first (up to "
                     "server.shutdown_grace_s = %g s)", name, self._alive(),
                     self.cfg.server.shutdown_grace_s)
            self.stopping = True

    # -- the loop ---------------------------------------------------------------------------

    def _wait_first(self, first: _Slot) -> int | None:
        """Wait for the first worker to serve; its exit status if it exits first (or 0 if
        serve is stopped meanwhile)."""
        while not first.serving:
            self._step(PARENT_POLL_S, restart=False)
            if self.stopping:
                return self._stop()
            if first.proc is None:
                code, how = self.last_exit
                if code == 2:  # a config error: it has said its one line already
                    return 2
                print(f"tollhouse: worker 1 {how} before serving; see the lines above",
                      file=sys.stderr)
                return 1
        return None

    def _timeout(self) -> float:
        dues = [s.due for s in self.slots if s.due is not None]
        if not dues:
            return PARENT_POLL_S  # a signal wakes it sooner; this is only a safety net
        return max(0.0, min(min(dues) - self.clock(), PARENT_POLL_S))

    def _step(self, timeout: float, *, restart: bool = True) -> None:
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 512):
                        pass
            else:
                self._read_ready(key.data)
        self._take_signals()
        self._reap(restart=restart and not self.stopping)
        if restart and not self.stopping:
            now = self.clock()
            for slot in self.slots:
                if slot.due is not None and slot.due <= now:
                    self._restart(slot)

    def _read_ready(self, slot: _Slot) -> None:
        assert slot.ready_fd is not None
        try:
            data = os.read(slot.ready_fd, 16)
        except OSError:
            data = b""
        if data:
            slot.serving = True
            self._forward_reload(slot)  # a reload while it started: it has the old config
        self._forget_ready(slot)  # said it serves, or closed the pipe (it is exiting)

    def _forget_ready(self, slot: _Slot) -> None:
        if slot.ready_fd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(slot.ready_fd)
            os.close(slot.ready_fd)
            slot.ready_fd = None

    def _reap(self, *, restart: bool) -> None:
        for slot in self.slots:
            if slot.proc is None or slot.proc.poll() is None:
                continue
            code, pid = slot.proc.returncode, slot.proc.pid
            how = _how(code)
            lived = self.clock() - slot.started
            slot.proc = None
            self._forget_ready(slot)
            # its in-flight gauge no longer counts
            mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]
            self.last_exit = code, how
            if self.stopping:
                if code not in (0, -signal.SIGTERM, -signal.SIGINT):
                    self.unclean = True
                log.info("worker %d (pid %d) %s", slot.index, pid, how)
                continue
            slot.failures = 1 if lived >= STABLE_S else slot.failures + 1
            if not restart:  # the first worker, before it served: _wait_first says it
                continue
            delay = min(RESTART_MIN_S * 2 ** (slot.failures - 1), RESTART_MAX_S)
            slot.due = max(slot.started + delay, self.clock())
            log.error("worker %d (pid %d) %s unexpectedly after %.1f s; restarting it in "
                      "%.1f s", slot.index, pid, how, lived, slot.due - self.clock())

    # -- starting and stopping ---------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        """Start worker `slot.index`: a fresh interpreter with the socket and a ready pipe."""
        ready_r, ready_w = os.pipe()
        listen_fd = self.sock.fileno()
        root = str(Path(__file__).resolve().parent.parent)  # this very `proxy` package
        env = dict(os.environ)  # without the secrets: serve withdrew them (confine.Environment)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env[MULTIPROC_ENV] = self.metrics_dir
        argv = [sys.executable, "-m", "proxy.runtime.workers", "--index", str(slot.index),
                "--fd", str(listen_fd), "--ready-fd", str(ready_w), "--parent", str(os.getpid()),
                "--log-level", self.log_level]
        slot.due, slot.serving, slot.started = None, False, self.clock()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(listen_fd, ready_w),
                                    env=env)
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        slot.proc, slot.ready_fd = proc, ready_r
        self._selector.register(ready_r, selectors.EVENT_READ, slot)
        assert proc.stdin is not None
        try:
            proc.stdin.write(pickle.dumps((self.cfg, self.config_path, self.env.copy())))
            slot.config = self.cfg
            proc.stdin.close()
        except BrokenPipeError:  # it died at once; _reap tells
            pass
        log.debug("started worker %d (pid %d)", slot.index, proc.pid)

    def _reload(self) -> None:
        """SIGHUP: the file checked here once (a fault is one line, and nothing is forwarded),
        kept for the workers started later, and SIGHUP sent to every worker that serves,
        each of which re-reads it and applies it to its next call (`Serving.reload`)."""
        from proxy.config import ConfigError, load, validate
        from proxy.runtime.reload import applied

        try:
            try:
                cfg = applied(self.cfg, load(self.config_path, self.env))
            finally:
                self.env.withdraw()  # a ${VAR} named for the first time leaves os.environ
            validate(cfg, self.base_dir)
        except ConfigError as exc:
            log.error("SIGHUP: config reload from %s refused, nothing changed: %s",
                      self.config_path, exc)
            return
        self.cfg = cfg
        log.info("SIGHUP: %d worker(s) reload %s", self._alive(), self.config_path)
        for slot in self.slots:
            self._forward_reload(slot)

    def _forward_reload(self, slot: _Slot) -> None:
        if slot.proc is not None and slot.serving and slot.config is not self.cfg:
            slot.config = self.cfg
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(signal.SIGHUP)

    def _restart(self, slot: _Slot) -> None:
        try:
            self._start(slot)
        except OSError as exc:  # no process could be made (out of fds, memory...): later
            slot.failures += 1
            delay = min(RESTART_MIN_S * 2 ** (slot.failures - 1), RESTART_MAX_S)
            slot.due = self.clock() + delay
            log.error("worker %d cannot be started (%s); trying again in %.1f s",
                      slot.index, exc.strerror or exc, delay)

    def _alive(self) -> int:
        return sum(s.proc is not None for s in self.slots)

    def _stop(self) -> int:
        """Forward SIGTERM, wait for every worker; 0 when all stopped by themselves."""
        self.stopping = True
        self.sock.close()  # new connections are refused once the workers close theirs
        for slot in self.slots:
            slot.due = None
            if slot.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGTERM)
        deadline = self.clock() + 2 * self.cfg.server.shutdown_grace_s + 10
        while self._alive():
            left = deadline - self.clock()
            if left <= 0:
                for slot in self.slots:
                    if slot.proc is not None:
                        log.error("worker %d (pid %d) still running %g s after SIGTERM: "
                                  "killing it", slot.index, slot.pid,
                                  2 * self.cfg.server.shutdown_grace_s + 10)
                        with contextlib.suppress(ProcessLookupError):
                            slot.proc.kill()
                        slot.proc.wait()
                        slot.proc = None
                return 1
            self._step(min(left, PARENT_POLL_S), restart=False)
        log.info("every worker has stopped")
        return 1 if self.unclean else 0


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def serve(cfg: Config, config_path: Path, sock: socket.socket, log_level: str,
          announce: Callable[[], None], env: Environment) -> int:
    """Run `cfg.server.workers` workers on `sock` until stopped; the exit status."""
    return Supervisor(cfg, config_path, sock, log_level, announce, env=env).run()


# ---------------------------------------------------------------------------------------------
# A worker


def _follow_parent(parent: int) -> None:
    """SIGTERM to this worker when the supervisor dies, so it drains and exits like on a stop
    instead of living on as an orphan."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0:
            if os.getppid() != parent:  # it died before the prctl: nobody will signal us
                os.kill(os.getpid(), signal.SIGTERM)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def worker_main(argv: list[str] | None = None) -> int:
    """One worker: the app for the config on stdin, served on the inherited socket."""
    p = argparse.ArgumentParser(prog="python -m proxy.runtime.workers",
                                description="a worker of `tollhouse serve` (started by it)")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--ready-fd", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the loop's handler reloads
    _follow_parent(args.parent)
    cfg, config_path, values = pickle.loads(sys.stdin.buffer.read())
    assert isinstance(cfg, Config) and isinstance(config_path, Path)
    env = Environment(values)
    base_dir = config_path.parent
    with open(os.devnull, "rb") as null:
        os.dup2(null.fileno(), 0)

    from proxy.config import ConfigError
    from proxy.runtime import serve

    serve.configure_logging(args.log_level, prefix=f"worker={args.index} pid={os.getpid()} ",
                 log_format=cfg.observability.log_format)
    confine.undumpable()  # as the supervisor: its memory holds the secrets
    try:
        app = serve.serving_app(cfg, base_dir, env)
    except ConfigError as exc:
        print(f"tollhouse: {exc}", file=sys.stderr)
        return 2
    env.withdraw()  # as serve does (its os.environ, the supervisor's, holds none of them)
    index, ready_fd = args.index, args.ready_fd
    serve.tune_collector(app, cfg.server)  # before the readiness below: it runs first

    @app.while_serving  # type: ignore[untyped-decorator]
    async def serving() -> AsyncIterator[None]:
        """After the app's own start-up (registered later, so it runs after): tell the
        supervisor this worker serves."""
        log.info("worker %d (pid %d) serving", index, os.getpid())
        with contextlib.suppress(OSError):
            os.write(ready_fd, b"r")
            os.close(ready_fd)
        yield

    def stopping(signum: int) -> None:
        log.info("worker %d (pid %d): %s: draining", index, os.getpid(),
                 signal.Signals(signum).name)

    serve.run_loop(serve.run_hypercorn(app, [f"fd://{args.fd}"], cfg.server.shutdown_grace_s,
                                    on_signal=stopping, config_path=config_path, env=env),
                 cfg.server.event_loop)
    log.info("worker %d (pid %d) stopped", index, os.getpid())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(worker_main())
