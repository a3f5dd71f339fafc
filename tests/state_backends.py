"""The live-state store the test suite runs on, and a fresh key prefix for each test.

`TOLLHOUSE_TEST_STATE` names the store of a run: `memory` (the default) or `redis` (the Redis
at `TOLLHOUSE_TEST_REDIS_URL`, default `redis://127.0.0.1:6379/0`). `make test` runs the suite
on both. Every config built through `tests.conftest.make_config` or the end-to-end stack gets
`state()`'s `[state]` table: on Redis, a key prefix of its own for each test, whose keys are
deleted when the test ends. A test about what only the memory store does (a clock injected into
`create_app` moving its expiries, its bounds) builds its config with `state={"url": "memory"}`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

BACKENDS = ("memory", "redis")
REDIS_URL = os.environ.get("TOLLHOUSE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def backend() -> str:
    name = os.environ.get("TOLLHOUSE_TEST_STATE", "memory").strip().lower() or "memory"
    if name not in BACKENDS:
        raise pytest.UsageError(f"TOLLHOUSE_TEST_STATE={name!r}: use memory or redis "
                                "(make test runs the suite on each)")
    return name


def on_redis() -> bool:
    return backend() == "redis"


_prefixes: list[str] = []  # the prefixes handed out in the running test


def fresh_prefix() -> str:
    """A key prefix no other test uses, whose keys go when the running test ends."""
    prefix = f"tollhouse-test:{secrets.token_hex(6)}:"
    _prefixes.append(prefix)
    return prefix


def state() -> dict[str, Any]:
    """The `[state]` table of this run for a config built in the running test."""
    if not on_redis():
        return {"url": "memory"}
    return {"url": REDIS_URL, "key_prefix": fresh_prefix()}


def delete_keys(prefix: str, url: str = REDIS_URL) -> int:
    """Delete every key under `prefix`; how many there were."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        doomed = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if doomed:
            client.delete(*doomed)
        return len(doomed)
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _per_test_prefixes() -> Iterator[None]:
    """Installed by tests/conftest.py for every test; deletes the keys of every prefix the
    test was given."""
    _prefixes.clear()
    try:
        yield
    finally:
        mine = list(_prefixes)
        _prefixes.clear()
        for prefix in mine:
            delete_keys(prefix)
