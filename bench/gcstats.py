"""`tollhouse` with the cycle collector watched: what each collection walked and took.

    .venv/bin/python bench/gcstats.py serve --config tollhouse.toml

runs the gateway as the console script does, with a `gc.callbacks` entry that counts, by
generation, the collections, the thread CPU they took, the objects they found unreachable, and
the objects they walked (the tracked objects in the generations collected, read with
`gc.get_objects` as each collection starts: that read costs about as much again as the
collection, so the main thread's CPU under this launcher is not the gateway's own). SIGUSR1
writes the running totals as JSON to `$GCSTATS_DIR/<pid>.json` (default the system's temporary
directory); `bench/threads.py --gc` reads them before and after each wrk run. A report tool,
not part of the gateway.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOTALS: dict[str, list[float]] = {key: [0, 0, 0] for key in
                                  ("collections", "cpu_s", "unreachable", "walked")}
_started = [0.0]


def _watch(phase: str, info: dict[str, Any]) -> None:
    generation = info["generation"]
    if phase == "start":
        TOTALS["walked"][generation] += sum(len(gc.get_objects(generation=g))
                                            for g in range(generation + 1))
        _started[0] = time.thread_time()
        return
    TOTALS["cpu_s"][generation] += time.thread_time() - _started[0]
    TOTALS["collections"][generation] += 1
    TOTALS["unreachable"][generation] += info["collected"]


def stats_path(pid: int) -> Path:
    return Path(os.environ.get("GCSTATS_DIR", tempfile.gettempdir())) / f"{pid}.json"


def _dump(*_: Any) -> None:
    target = stats_path(os.getpid())
    partial = target.with_suffix(".part")
    partial.write_text(json.dumps(TOTALS))
    partial.replace(target)  # whole or absent for the reader


if __name__ == "__main__":
    gc.callbacks.append(_watch)
    signal.signal(signal.SIGUSR1, _dump)
    from proxy.runtime.cli import main

    sys.argv[0] = "tollhouse"
    sys.exit(main(sys.argv[1:]))
