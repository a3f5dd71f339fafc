"""CPU time of whole process groups, read from /proc (Linux): the gateway's cost per call.

Every server the harness starts leads its own process group (`start_new_session`), and a
worker or helper it forks stays in that group, so summing the group's members counts the
workers too. A process's utime + stime already includes all its threads. Clock-tick
resolution (10 ms) is fine over a run of thousands of calls.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def stat_fields(stat: str) -> list[str]:
    """The fields after the command name (which may hold spaces and parentheses)."""
    return stat[stat.rindex(")") + 2:].split()


def group_cpu_s(pgids: Collection[int]) -> float:
    """utime + stime, in seconds, of every live process whose process group is in `pgids`."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields((entry / "stat").read_text())
        except (OSError, ValueError):  # gone meanwhile
            continue
        if int(fields[2]) in pgids:  # pgrp; utime and stime are fields 14 and 15 of stat
            total += int(fields[11]) + int(fields[12])
    return total * TICK_S


def group_size(pgid: int) -> int:
    """How many live processes are in process group `pgid` (a server and its workers)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(stat_fields((entry / "stat").read_text())[2]) == pgid:
                    count += 1
            except (OSError, ValueError):
                continue
    return count


def pid_cpu_s(pid: int) -> float | None:
    """utime + stime of one process (its threads included), or None when it is out of sight."""
    try:
        fields = stat_fields(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError):
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S


def thread_kernel_s(pid: int, tid: int | None = None) -> float:
    """stime of one thread of `pid` (its main thread by default): what the kernel did for it."""
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat_fields(stat)[12]) * TICK_S


def wait_quiet(pgids: Collection[int], deadline_s: float, window_s: float, busy_s: float) -> bool:
    """Poll the process groups' CPU every `window_s` until one window uses less than `busy_s`
    of it (True), or `deadline_s` passes (False)."""
    end = time.monotonic() + deadline_s
    last = group_cpu_s(pgids)
    while time.monotonic() < end:
        time.sleep(window_s)  # the sampling interval (a poll with a deadline, not a wait for a guess)
        now = group_cpu_s(pgids)
        if now - last < busy_s:
            return True
        last = now
    return False


def listener_pid(port: int) -> int | None:
    """The process listening on 127.0.0.1:`port` (the Redis server), found through its socket's
    inode; None when it cannot be seen (another namespace, no permission)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
    return None
