"""The keeper a stdio server runs under, so that nothing it starts outlives the gateway.

`python -I -S keeper.py <gateway pid> <uid> <gid> <command> <args...>`, started by
proxy.upstream.supervisor as the leader of the child's session and process group, with its
limits and working directory, as the gateway's user; the server runs as `uid`:`gid` with no
supplementary groups (-1: the gateway's user), so with `run_as` it cannot signal its keeper.
Plain standard library, no import from the gateway: it starts in milliseconds.

The kernel does the work. The keeper is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever
the server starts and leaves behind, even a process that called setsid to leave the group, is
reparented to the keeper rather than to init. It gets a death signal when the gateway ends
(PR_SET_PDEATHSIG, SIGUSR1, so a kill -9 of the gateway is seen too); the server gets SIGKILL
when the keeper ends. The keeper ends, and first kills every process below it, when the server
exits, when the gateway dies, or GRACE_S after the gateway's SIGTERM (the server has that
SIGTERM too, to finish cleanly). Its exit status is the server's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 1.0  # after SIGTERM; below the gateway's own grace (supervisor.STOP_GRACE_S)
WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}


def _prctl(libc: Any, option: int, value: int) -> None:
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _descendants() -> set[int]:
    """Every process below this one (its children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    below: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - below
        below |= frontier
    return below


def _kill_all() -> None:
    """SIGKILL to everything below, and every child reaped, until none is left (one that
    forks meanwhile leaves its children to this subreaper: the next round takes them)."""
    while True:
        for pid in _descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    gateway, uid, gid, command = int(argv[1]), int(argv[2]), int(argv[3]), argv[4:]
    libc = ctypes.CDLL(None, use_errno=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    _prctl(libc, PR_SET_CHILD_SUBREAPER, 1)
    _prctl(libc, PR_SET_PDEATHSIG, signal.SIGUSR1)
    if os.getppid() != gateway:  # the gateway ended before the death signal was set
        return 1
    server = os.fork()
    if server == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        try:
            if uid >= 0:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            _prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"cannot start {command[0]!r}: {exc}\n".encode())
        os._exit(127)
    os.close(0)  # the pipes are the server's: its end of them is its own
    os.close(1)
    status: int | None = None
    deadline: float | None = None
    while status is None:
        if deadline is None:
            signo: int | None = signal.sigwait(WATCHED)
        else:
            got = signal.sigtimedwait(WATCHED, max(0.0, deadline - time.monotonic()))
            signo = got.si_signo if got is not None else None
        if signo is None or signo == signal.SIGUSR1:  # grace over, or the gateway gone
            break
        if signo == signal.SIGCHLD:
            while True:  # the server, or an orphan it left to this subreaper
                try:
                    pid, code = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if pid == server:
                    status = os.waitstatus_to_exitcode(code)
        elif deadline is None:  # the gateway's SIGTERM (SIGINT, SIGHUP): the server's too
            deadline = time.monotonic() + GRACE_S
            try:
                os.kill(server, signal.SIGTERM)  # in case it left the group
            except OSError:
                pass
    _kill_all()
    if status is None:
        return 1
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
