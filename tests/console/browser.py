"""Headless Chromium (Debian's `chromium` and `chromium-driver`) driven by Selenium for the
console's browser tests, axe-core (npm, pinned, in the gitignored .cache/console) for the
accessibility check, screenshots under build/console-screenshots/; and a gateway stack served
from a thread of its own, since Selenium's calls block."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.locks import installing

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
AXE_VERSION = "4.14.1"
AXE_DIR = ROOT / ".cache" / "console"
AXE = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
SHOTS = ROOT / "build" / "console-screenshots"


def axe_source() -> str:
    """axe-core's script, installed from the npm registry at AXE_VERSION on first use."""
    with installing(AXE_DIR):
        if not AXE.exists() or f'"version": "{AXE_VERSION}"' not in \
                (AXE.parent / "package.json").read_text():
            npm = shutil.which("npm")
            assert npm, "axe-core needs npm (.ci/run installs it)"
            subprocess.run([npm, "install", "--silent", "--no-save", "--prefix", str(AXE_DIR),
                            f"axe-core@{AXE_VERSION}"], check=True, timeout=300)
        return AXE.read_text()


@contextmanager
def chromium() -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def serious_violations(driver: Any, axe: str) -> list[str]:
    """axe-core's serious and critical violations on the current page (WCAG 2 A/AA)."""
    driver.execute_script(axe)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: ['wcag2a', 'wcag2aa']})"
        ".then(r => done(r.violations.map(v => [v.impact, v.id, v.nodes.length,"
        " v.nodes[0].target.join(' ')])), e => done([['error', String(e), 0, '']]));")
    return [f"{impact} {rule} x{n}: {target}" for impact, rule, n, target in result
            if impact in ("serious", "critical", "error")]


class Background:
    """An async stack (`open_stack()`, an async context manager yielding a value) served by
    an event loop in another thread until `close`."""

    def __init__(self, open_stack: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self._open = open_stack
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.value: Any = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        try:
            async with self._open() as value:
                self.value = value
                self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self._error = exc
            self._ready.set()

    def __enter__(self) -> Any:
        self._thread.start()
        assert self._ready.wait(60), "the stack did not start within 60 s"
        if self._error is not None:
            raise self._error
        return self.value

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if self._error is not None and exc[0] is None:
            raise self._error
