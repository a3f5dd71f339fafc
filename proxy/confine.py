"""The gateway's own process, closed to the processes it starts (docs/per-caller-and-stdio.md).

Its secrets leave the process environment once read (`Environment`): `tollhouse serve` keeps
a private copy of the environment it started with, reads the config's `${VAR}`s and its own
secrets from that copy (at start and on every reload; a worker gets the copy from the
supervisor), and takes each name it read, and every `TOLLHOUSE_*` one, out of os.environ. A
process the gateway starts later (a worker, anything a hook or library runs) inherits none of
them, and no code in the gateway finds them in os.environ.

A stdio server runs as the gateway's user unless its `run_as` names another, and a process of
the same user may read another's /proc/<pid>/environ (the environment it was started with:
TOLLHOUSE_SECRET_KEY, database URLs; taking them out of os.environ later changes nothing
there), read its memory, or attach a debugger. Not dumpable (PR_SET_DUMPABLE 0), the gateway
is closed to all of that for every process without CAP_SYS_PTRACE, and writes no core dump
(which would hold the same secrets). An exec sets the flag again, so what the gateway starts
is unaffected. py-spy and gdb then attach only as root.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Iterator, Mapping

log = logging.getLogger("tollhouse")

PR_SET_DUMPABLE = 4

# the process's own variables, which the interpreter, libc and the programs the gateway runs
# read, and which hold no secret: they stay in os.environ even when a `${VAR}` names them
KEPT = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "TMPDIR", "TZ", "LANG",
                  "LANGUAGE", "TERM", "HOSTNAME", "PYTHONPATH"})
OWN_PREFIX = "TOLLHOUSE_"  # Tollhouse's own variables: secrets (TOLLHOUSE_SECRET_KEY...) or not


class Environment(Mapping[str, str]):
    """The environment `tollhouse serve` started with, as a private copy: the config file is
    read against it (`${VAR}`), at start and on every reload, and so are the secrets the
    gateway reads by name (TOLLHOUSE_SECRET_KEY, TOLLHOUSE_VAULT_KEYS). It remembers every
    name looked up, so `withdraw` can take those out of os.environ. A value changed outside
    the process needs a restart, as it always did: nothing outside a process changes its
    environment."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)
        self._read: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self._read.add(name)
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self._read.add(name)
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def copy(self) -> dict[str, str]:
        """Every value, for a worker's own Environment (marks nothing as read)."""
        return dict(self._values)

    def withdraw(self) -> list[str]:
        """Take every name read so far, and every TOLLHOUSE_* one, out of os.environ (and so
        out of the C environment every child inherits), except the process's own (`KEPT`);
        the names taken. /proc/<pid>/environ keeps the environment of the exec all the same:
        `undumpable` closes that."""
        gone = [name for name in os.environ
                if (name in self._read or name.startswith(OWN_PREFIX)) and not _kept(name)]
        for name in gone:
            del os.environ[name]
        return gone


def _kept(name: str) -> bool:
    return name in KEPT or name.startswith("LC_")


def undumpable() -> bool:
    """Make this process not dumpable; False (and a warning) where the kernel cannot."""
    if not sys.platform.startswith("linux"):
        log.warning("not on Linux: the gateway's environment and memory stay readable by "
                    "processes of its user, stdio servers without run_as among them")
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed (errno %d): the gateway's environment "
                    "stays readable by processes of its user", ctypes.get_errno())
        return False
    return True
