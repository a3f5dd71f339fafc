"""The gateway's own process, closed to the processes it starts (README, "Local upstreams:
stdio servers").

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
import sys

log = logging.getLogger("tollhouse")

PR_SET_DUMPABLE = 4


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
