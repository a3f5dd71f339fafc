"""How a process serves the app: the app `tollhouse serve` and each worker run
(`serving_app`), its log lines (`configure_logging`), the cycle collector's settings
(`tune_collector`, `refreeze` after a reload), the event loop (`run_loop`) and Hypercorn with
its signals (`run_hypercorn`: drain on SIGINT/SIGTERM, reload on SIGHUP). `proxy.runtime.cli`
(one process) and `proxy.runtime.workers` (several) both serve through it."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from proxy import confine
from proxy.config import Config, ServerConfig

T = TypeVar("T")

log = logging.getLogger("tollhouse")


def configure_logging(level: str, prefix: str = "", log_format: str = "text") -> None:
    """Log lines to stderr, text or JSON (`observability.log_format`); a worker of several
    puts `worker=N pid=P ` in front of each."""
    from proxy.observability import logs

    logs.configure(level, prefix, log_format)


def serving_app(cfg: Config, base_dir: Path, env: confine.Environment) -> Any:
    """The app `serve` (or a worker) runs, with the secrets it reads by name taken from `env`,
    the environment it started with, never from os.environ."""
    from proxy.connect.vault import keys_from_env
    from proxy.runtime.app import create_app

    per_user = any(u.auth == "per_user" for u in cfg.upstreams)
    return create_app(cfg, base_dir=base_dir, secret_key=env.get("TOLLHOUSE_SECRET_KEY", ""),
                      vault_keys=keys_from_env(env) if per_user else None)


def tune_collector(app: Any, server: ServerConfig) -> None:
    """The cycle collector's settings of [server] for `app`'s serving process (`tollhouse
    serve` and each worker): gc_freeze, then gc_threshold and gc_sweep_s."""
    freeze_after_start(app, server.gc_freeze)
    collect_on_schedule(app, server.gc_threshold, server.gc_sweep_s)


def freeze_after_start(app: Any, enabled: bool) -> None:
    """`server.gc_freeze`: once `app` has started (registered after its own start-up, so it
    runs after it), collect start-up's garbage and freeze what is left (gc.freeze). Python's
    full collection walks every tracked object; without this, each one walked the ~270,000
    the imported libraries made at start-up, about 70 ms every few thousand calls, and the
    longer a call's objects live (an audit record waits up to the commit window), the more
    often one runs. A reload freezes again (`refreeze`)."""
    if not enabled:
        return

    @app.while_serving  # type: ignore[untyped-decorator]
    async def frozen() -> Any:
        gc.collect()
        gc.freeze()
        log.info("gc: %d objects of start-up frozen (server.gc_freeze)", gc.get_freeze_count())
        yield


# timed collections: a full one once the heap has grown by a quarter since the last (Python's
# own rule for its old generation), and at least this often (cyclic garbage can hold a socket
# or a file while the heap holds steady)
GC_FULL_GROWTH = 1.25
GC_FULL_AT_LEAST_S = 3600.0


def collect_on_schedule(app: Any, threshold: int, sweep_s: float) -> None:
    """`server.gc_threshold` and `server.gc_sweep_s`, while `app` serves.

    Python runs a young collection whenever the tracked objects allocated, net of those freed,
    pass 700: concurrent calls allocate in bursts that pass it every few calls, and each
    collection walks every young object then alive, the more the more calls are in flight
    (under wrk, 15-40 us a call on the loop, doubling from 16 calls in flight to 64; almost
    nothing found, well under one object a call). A threshold above the bursts makes those
    collections rare. Because the count never goes below zero (frees after a collection
    do not count against later allocations), a high threshold alone could leave cyclic
    garbage waiting indefinitely: the timed collections find it within `sweep_s` (the young
    and middle generations, about a millisecond). A full collection walks every object alive
    (about 15 ms for 100,000 sessions, 150 ms for a million), so it comes as Python's own rule
    brings it: once the heap (`sys.getallocatedblocks`, under 0.2 ms to read at a million
    sessions) has grown by a quarter since the last one, and at least every hour; cyclic
    garbage that reached the old generation is at most a quarter of the heap."""

    @app.while_serving  # type: ignore[untyped-decorator]
    async def scheduled() -> Any:
        before = gc.get_threshold()
        gc.set_threshold(threshold, *before[1:])
        log.info("gc: young threshold %d (server.gc_threshold), %s", threshold,
                 f"timed collections every {sweep_s:g} s (server.gc_sweep_s)" if sweep_s
                 else "no timed collections (server.gc_sweep_s = 0)")
        sweeping = asyncio.get_running_loop().create_task(_sweep(sweep_s)) if sweep_s else None
        try:
            yield
        finally:
            if sweeping is not None:
                sweeping.cancel()
                await asyncio.gather(sweeping, return_exceptions=True)
            gc.set_threshold(*before)


async def _sweep(interval_s: float) -> None:
    clock = asyncio.get_running_loop().time
    heap, last_full = sys.getallocatedblocks(), clock()
    while True:
        await asyncio.sleep(interval_s)
        if (sys.getallocatedblocks() >= heap * GC_FULL_GROWTH
                or clock() - last_full >= GC_FULL_AT_LEAST_S):
            gc.collect(2)
            heap, last_full = sys.getallocatedblocks(), clock()
        else:
            gc.collect(1)


def refreeze() -> None:
    """After a reload, when start-up froze: what the old config's objects left in cycles is
    collected, and what is alive now frozen again. One full collection; reloads are rare."""
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
        gc.freeze()


def run_loop(main: Coroutine[Any, Any, T], event_loop: str = "asyncio") -> T:
    """Run `main` to its end on a new event loop of the kind `server.event_loop` names."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if event_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        # once a process, here where the loop is made: `tollhouse demo` serves two apps on it
        loop = runner.get_loop()
        log.debug("event loop: %s.%s", type(loop).__module__, type(loop).__qualname__)
        return runner.run(main)


async def run_hypercorn(app: Any, binds: list[str], grace_s: float,
                         stop: asyncio.Event | None = None,
                         on_signal: Callable[[int], None] | None = None,
                         config_path: Path | None = None,
                         env: confine.Environment | None = None,
                         errorlog: str = "hypercorn.error") -> None:
    """Serve `app` until SIGINT/SIGTERM (or `stop`); `on_signal` hears which signal stopped
    it. A stop signal drains a Tollhouse app first (`Serving.drain`: new calls refused, calls
    in flight given up to `grace_s`), then Hypercorn closes the connections within what is
    left of it; a second stop signal changes nothing. With `config_path`, SIGHUP reloads the
    config from it (`Serving.reload`), its `${VAR}`s read from `env`, the environment the
    process started with (os.environ without it). `errorlog`: the logger Hypercorn's own
    lines (`Running on ...`) go to."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HyperConfig

    from proxy.runtime import idle_close

    idle_close.install()  # a client's EOF on a kept-alive connection closes it at once
    hc = HyperConfig()
    hc.bind = binds
    hc.accesslog = None
    hc.errorlog = logging.getLogger(errorlog)
    hc.graceful_timeout = grace_s
    hc.keep_alive_timeout = 75
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()
    reloading = asyncio.Lock()

    def spawn(coro: Any) -> None:
        task = loop.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def drain_then_stop() -> None:
        serving = _serving(app)
        try:
            if serving is not None:
                hc.graceful_timeout = max(await serving.drain(grace_s), 1.0)
        finally:
            stop.set()

    draining = False

    def stopped(signum: int) -> None:
        nonlocal draining
        if draining or stop.is_set():
            return
        draining = True
        if on_signal is not None:
            on_signal(signum)
        spawn(drain_then_stop())

    async def reload() -> None:
        serving = _serving(app)
        if serving is None or config_path is None:
            return
        async with reloading:
            await serving.reload(config_path, env)
            refreeze()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped, sig)
    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, lambda: spawn(reload()))
    await serve(app, hc, shutdown_trigger=stop.wait)


def _serving(app: Any) -> Any:
    """The app's `proxy.runtime.serving.Serving` while it serves, else None (another ASGI app)."""
    from proxy.held import EXTENSION

    extensions = getattr(app, "extensions", None)
    services = extensions.get(EXTENSION) if isinstance(extensions, dict) else None
    return getattr(services, "serving", None)
