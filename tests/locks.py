"""Locks the suite takes around what it installs on first use (standard library only: `.ci/run`
runs `python3 -m tests.stdio.everything` before the venv's packages are needed)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def installing(directory: Path) -> Iterator[None]:
    """One installer at a time into `directory` (an npm prefix the suite fills on first
    use): `make test` runs passes side by side, and two `npm install`s into one prefix
    break each other. The caller checks again inside, since the other may have installed."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".install-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
