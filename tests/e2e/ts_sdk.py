"""The official TypeScript SDK (`@modelcontextprotocol/sdk`, pinned, from the npm registry into
the gitignored .cache/ts-sdk) as an OAuth client: `ts_client(...)` runs
tests/e2e/ts_oauth_client.mjs under Node and talks to it in JSON lines; a person's sign-in and
consent are the test's own (tests/e2e/test_oauth_sdk.Browser, plain HTTP)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import DEADLINE_S
from tests.locks import installing

VERSION = "1.32.2"
ROOT = Path(__file__).resolve().parents[2]
DIRECTORY = ROOT / ".cache" / "ts-sdk"
PACKAGE = DIRECTORY / "node_modules" / "@modelcontextprotocol" / "sdk"
DRIVER = Path(__file__).with_name("ts_oauth_client.mjs")


def _installed() -> bool:
    try:
        return json.loads((PACKAGE / "package.json").read_text())["version"] == VERSION
    except (OSError, ValueError, KeyError):
        return False


def sdk_dir() -> Path:
    """The SDK's dist/esm, installed at VERSION on first use."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("needs Node and npm (tests/prereqs.sh installs them)")
    with installing(DIRECTORY):
        if not _installed():
            subprocess.run(["npm", "install", "--silent", "--no-save", "--no-audit", "--no-fund",
                            "--prefix", str(DIRECTORY), f"@modelcontextprotocol/sdk@{VERSION}"],
                           check=True, timeout=600)
    return PACKAGE / "dist" / "esm"


class TsClient:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.wire: list[list[Any]] = []  # [path, status, grant_type, error] of /oauth/ requests

    async def _line(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        raw = await asyncio.wait_for(self._process.stdout.readline(), DEADLINE_S * 3)
        assert raw, "the TypeScript client ended"
        message: dict[str, Any] = json.loads(raw)
        if "wire" in message:
            self.wire = message["wire"]
        return message

    async def send(self, **command: Any) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command).encode() + b"\n")
        await self._process.stdin.drain()

    async def ask(self, **command: Any) -> dict[str, Any]:
        await self.send(**command)
        return await self._line()

    async def authorize_event(self) -> str:
        message = await self._line()
        assert message.get("event") == "authorize", message
        return str(message["url"])

    async def answer(self) -> dict[str, Any]:
        return await self._line()

    def grants(self, grant_type: str) -> list[tuple[int, str]]:
        return [(w[1], w[3]) for w in self.wire if w[0] == "/oauth/token" and w[2] == grant_type]


@asynccontextmanager
async def ts_client(redirect_uri: str) -> AsyncIterator[TsClient]:
    sdk = sdk_dir()
    process = await asyncio.create_subprocess_exec(
        "node", str(DRIVER), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={"TS_SDK_DIR": str(sdk), "REDIRECT_URI": redirect_uri, "PATH": "/usr/bin:/bin"})
    try:
        yield TsClient(process)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
