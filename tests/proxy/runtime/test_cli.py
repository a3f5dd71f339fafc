"""The console script: start-up refusals are one clear line and a non-zero exit."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from quart import Quart

from proxy.runtime import serve
from proxy.runtime.cli import main
from proxy.runtime.serve import collect_on_schedule, freeze_after_start, refreeze
from tests.helpers import until


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[server]\nlisten = "127.0.0.1:8080"\nbogus = 1\n', "unknown key 'server.bogus'"),
        ('[[upstreams]]\nname = "a"\nurl = "localhost:3001"\n', "'upstreams[0].url'"),
        ('[server]\nmax_request_bytes = "4MB"\n', "'server.max_request_bytes' must be an integer"),
    ],
)
def test_serve_refuses_a_bad_config(tmp_path: Path, capsys, text: str, message: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_serve_without_a_config(monkeypatch, capsys) -> None:
    monkeypatch.delenv("TOLLHOUSE_CONFIG", raising=False)
    assert main(["serve"]) == 2
    assert "pass --config PATH or set TOLLHOUSE_CONFIG" in capsys.readouterr().err


def test_console_script_reads_tollhouse_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[auth]\nmode = "magic"\n')
    result = subprocess.run([sys.executable, "-m", "proxy", "serve"], capture_output=True,
                            text=True, env={"TOLLHOUSE_CONFIG": str(cfg), "PATH": ""},
                            timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tollhouse: config: 'auth.mode' must be one of none, jwt")


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """A test that freezes leaves nothing frozen for the tests after it."""
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.mark.parametrize("enabled", [True, False])
async def test_server_gc_freeze_freezes_what_start_up_left(unfrozen: None, enabled: bool
                                                           ) -> None:
    app = Quart(__name__)
    started: list[int] = []

    @app.while_serving
    async def own_start_up():  # the app's own, registered first: it runs before the freeze
        started.append(gc.get_freeze_count())
        yield

    freeze_after_start(app, enabled)
    async with app.test_app():
        assert started == [0]
        assert (gc.get_freeze_count() > 0) is enabled


def test_refreeze_collects_what_was_frozen_and_has_become_garbage(unfrozen: None) -> None:
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    gc.collect()
    gc.freeze()
    del cycle  # garbage now, but frozen: the collector does not look at it
    gc.collect()
    assert alive() is not None
    refreeze()  # as after a reload
    assert alive() is None
    assert gc.get_freeze_count() > 0  # and what is alive is frozen again


def test_refreeze_does_nothing_when_start_up_did_not_freeze(unfrozen: None) -> None:
    refreeze()
    assert gc.get_freeze_count() == 0


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The interpreter's thresholds, put back after the test whatever it did."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


async def until_collected(alive: weakref.ref[_Cycle]) -> None:
    await until(lambda: alive() is None, 5.0, "the cycle's collection")


async def test_the_threshold_holds_while_serving_and_is_put_back(thresholds) -> None:
    app = Quart(__name__)
    collect_on_schedule(app, 12_345, 0)
    async with app.test_app():
        assert gc.get_threshold() == (12_345, *thresholds[1:])
    assert gc.get_threshold() == thresholds


def garbage_cycle(old: bool) -> weakref.ref[_Cycle]:
    """A reference cycle nothing else holds, in the young generation or (`old`: it was alive
    through a full collection) in the old one, which only a full collection walks."""
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    if old:
        gc.collect()
    del cycle
    return alive


# the threshold out of reach: no automatic collection comes in a test's time
async def test_timed_collections_free_young_cyclic_garbage(thresholds) -> None:
    app = Quart(__name__)
    collect_on_schedule(app, 1_000_000, 0.02)
    async with app.test_app():
        await until_collected(garbage_cycle(old=False))


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection that ends while the test runs."""
    seen: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    gc.callbacks.append(watch)
    yield seen
    gc.callbacks.remove(watch)


async def until_swept(seen: list[int], count: int) -> None:
    await until(lambda: len(seen) >= count, 5.0, f"{count} timed collections")


async def test_an_old_cycle_waits_until_the_heap_grows_by_a_quarter(
        thresholds, collections: list[int]) -> None:
    app = Quart(__name__)
    collect_on_schedule(app, 1_000_000, 0.01)
    async with app.test_app():
        alive = garbage_cycle(old=True)
        collections.clear()
        await until_swept(collections, 15)
        # the heap held steady: no full collection walked every object alive
        assert 2 not in collections
        assert alive() is not None
        ballast = [object() for _ in range(int(sys.getallocatedblocks() * 0.3))]
        await until_collected(alive)
        assert 2 in collections
        del ballast


async def test_an_old_cycle_is_freed_within_the_longest_wait(
        thresholds, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "GC_FULL_AT_LEAST_S", 0.05)
    app = Quart(__name__)
    collect_on_schedule(app, 1_000_000, 0.01)
    async with app.test_app():
        await until_collected(garbage_cycle(old=True))


async def test_without_timed_collections_a_cycle_waits_for_the_threshold(thresholds) -> None:
    app = Quart(__name__)
    collect_on_schedule(app, 1_000_000, 0)
    async with app.test_app():
        alive = garbage_cycle(old=False)
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert alive() is not None  # what the timed collections are for
        gc.collect()
        assert alive() is None


@pytest.mark.parametrize("command", [["keys", "list"], ["users", "list"], ["db", "upgrade"],
                                     ["audit"], ["usage"]])
def test_each_command_migrates_a_fresh_database_in_a_fresh_process(
        tmp_path: Path, command: list[str]) -> None:
    """A command run alone (its own interpreter, nothing else imported) brings a new
    database to the whole schema: the features that register their tables' migrations (the
    audit rollups) are registered by the process, whichever command opens the database."""
    config = tmp_path / "c.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/fresh.db"\n'
                      '[[upstreams]]\nname = "up"\nurl = "http://127.0.0.1:9/mcp"\n')
    done = subprocess.run([sys.executable, "-m", "proxy", *command, "--config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
