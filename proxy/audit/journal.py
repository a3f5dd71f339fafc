"""The audit journal: a write-ahead file that makes an answer's audit record (and the usage
event that rides with it) durable against a crash without waiting for a database commit.

Before an answer leaves, its record is appended to the journal with one `write` on the event
loop (a few hundred bytes into the OS's page cache, which a killed process cannot lose: the
kernel holds them); the audit writer thread commits it to the database later, with whatever
else has queued, and nothing waits for that commit. What is lost to a power cut is out of scope
here as it is for the database's own `synchronous=NORMAL` (the journal is never fsynced either).

Files: `<base>.<pid>-<random>.<n>.jsonl`, one line per record in the fallback file's format.
Each process writes its own live segment and holds an exclusive `flock` on it for as long as it
may still need it, so another process never takes a live one: the lock dies with its process,
which is exactly when a segment becomes an orphan. When a segment passes `rotate_bytes` the
process opens the next and hands the old one to the writer thread behind its last record; once
those records are committed (or in the fallback file) the writer removes it. A clean stop
removes the last. At start, every segment no live process holds is an orphan: the sink replays
it into the database (records already there are skipped) and removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("tollhouse.audit")

ROTATE_BYTES = 4 * 1024 * 1024


class Segment:
    """One journal file, open and locked by this process."""

    __slots__ = ("fd", "path", "size")

    def __init__(self, path: Path) -> None:
        self.path = path
        # made and locked under a name no replayer looks at, then renamed (the lock stays):
        # a replay never meets a live segment unlocked
        making = path.with_suffix(".making")
        self.fd = os.open(making, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(making, path)
        except OSError:
            os.close(self.fd)
            with contextlib.suppress(OSError):
                making.unlink()
            raise
        self.size = 0

    def close(self, *, remove: bool) -> None:
        """Remove the file (its records are all kept elsewhere) or leave it for the next start's
        replay; either way the lock goes with the descriptor."""
        if remove:
            try:
                self.path.unlink()
            except OSError as exc:
                log.warning("audit: cannot remove the journal segment %s (%s)", self.path, exc)
        os.close(self.fd)


class Journal:
    """This process's journal under `base` (a path prefix). `append` is the event loop's;
    `retired` hands back a full segment for the writer thread to close behind its records."""

    def __init__(self, base: str | Path, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.base = Path(base)
        self._rotate_bytes = rotate_bytes
        self._stem = f"{self.base.name}.{os.getpid()}-{secrets.token_hex(4)}"
        self._n = 0
        self.segment = self._open()

    def _open(self) -> Segment:
        self._n += 1
        return Segment(self.base.parent / f"{self._stem}.{self._n}.jsonl")

    def append(self, line: bytes) -> bool:
        """`line` (ending in a newline) in the journal; False if it could not be written (a
        full disk): the caller then waits for the database instead."""
        segment = self.segment
        try:
            written = os.write(segment.fd, line)
            if written != len(line):  # (a short write to a regular file: the disk filled)
                os.write(segment.fd, b"\n")  # the next start skips the cut line
                return False
        except OSError:
            return False
        segment.size += written
        return True

    def full(self) -> Segment | None:
        """If the live segment has passed its size, the next one is live from now on and the
        old one is returned, for the writer to close once what it holds is committed."""
        if self.segment.size < self._rotate_bytes:
            return None
        try:
            fresh = self._open()
        except OSError as exc:  # keep appending to the old one rather than lose anything
            log.warning("audit: cannot open a new journal segment (%s)", exc)
            return None
        old, self.segment = self.segment, fresh
        return old


def orphans(base: str | Path) -> Iterator[tuple[Path, int]]:
    """The journal segments under `base` that no live process holds, each locked for the
    caller (path, descriptor): read it from the descriptor, then `release` it."""
    base = Path(base)
    prefix = f"{base.name}."
    try:
        names = sorted(p for p in base.parent.iterdir()
                       if p.name.startswith(prefix) and p.name.endswith(".jsonl"))
    except OSError:
        return
    for path in names:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # removed meanwhile by its owner or another replayer
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # still the file at that name: not one another replayer removed after we opened it
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                raise OSError
        except OSError:  # held by a live process, or gone
            os.close(fd)
            continue
        yield path, fd


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def release(path: Path, fd: int, *, remove: bool) -> None:
    if remove:
        try:
            path.unlink()
        except OSError as exc:
            log.warning("audit: cannot remove the replayed journal %s (%s)", path, exc)
    os.close(fd)
