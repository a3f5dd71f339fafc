"""Fixtures of the multi-replica tests: an official-SDK upstream served in the test's loop,
and two gateway processes behind HAProxy in front of it (`tests/replicas/harness.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.upstreams import UpstreamProbe, stateful_sse_app
from tests.replicas.harness import Cluster, open_cluster
from tests.servers import serve


@dataclass
class Upstream:
    url: str
    probe: UpstreamProbe


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """A stateful (2025-11-25 sessions, SSE answers) official-SDK upstream."""
    app, probe = stateful_sse_app()
    async with serve(app, graceful_timeout=1) as url:
        yield Upstream(url, probe)


@pytest.fixture
async def cluster(tmp_path: Path, upstream: Upstream) -> AsyncIterator[Cluster]:
    """Two replicas in front of `upstream`, as a legacy upstream, behind HAProxy."""
    async with open_cluster(tmp_path, upstream.url, era="legacy") as running:
        yield running
