"""Every file Tollhouse makes that holds data is its own account's alone (0600) whatever the
umask: the SQLite database with its -wal and -shm (password hashes, API-key rows, the audit
log, the sealed vault) and the audit journal's segments (#36 item 8)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.auth import keys as api_keys
from proxy.demo import demo_app
from proxy.storage.db import Database
from tests.e2e.sdk_client import connect
from tests.stack import gateway_stack


@pytest.fixture
def umask_022() -> Iterator[None]:
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}


async def test_the_database_and_its_side_files_are_private(tmp_path: Path,
                                                           umask_022: None) -> None:
    data = tmp_path / "data"
    url = f"sqlite:///{data / 'tollhouse.db'}"
    _, secret = api_keys.create(url, "ci", ["demo"])
    async with gateway_stack(lambda urls: {
            "auth": {"mode": "jwt"}, "database": {"url": url},
            "upstreams": [{"name": "demo", "url": f"{urls.upstream}/mcp"}]},
            upstream=demo_app(), secret_key="k") as site, \
            connect(site.endpoint("demo"), headers={"Authorization": f"Bearer {secret}"}) as client:
        assert (await client.call_tool("echo", {"text": "hi"})).is_error is False
        modes = _modes(data)
    assert {"tollhouse.db", "tollhouse.db-wal", "tollhouse.db-shm"} <= set(modes)
    assert {name: mode for name, mode in modes.items() if mode != 0o600} == {}


def test_a_database_left_readable_becomes_private(tmp_path: Path, umask_022: None) -> None:
    """A file an earlier version made 0644 loses the others' bits at the next start."""
    path = tmp_path / "old.db"
    for name in ("old.db", "old.db-wal", "old.db-shm"):
        (tmp_path / name).touch(0o644)
    (tmp_path / "old.db-wal").write_bytes(b"")
    database = Database(f"sqlite:///{path}")
    try:
        with database.transaction() as conn:
            conn.execute("SELECT 1")
    finally:
        database.close()
    assert {name: mode for name, mode in _modes(tmp_path).items() if mode != 0o600} == {}
