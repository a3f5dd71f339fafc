"""A metering hook that runs inside the gateway (`metering.hook =
"tests.proxy.runtime.environ_hook:HOOK"`) and tells what its process environment holds: `echo` is
allowed, any other tool is denied with, as the message to the caller (JSON, within the 500
characters a message keeps), the names in the gateway's os.environ, those in the environment a
process it starts inherits, and of both the names whose value carries the tests' SECRETVALUE
marker (under whatever name a secret might have been copied)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

MARKER = "SECRETVALUE"
CHILD = "import json, os, sys; json.dump(dict(os.environ), sys.stdout)"


class _EnvironHook:
    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["tool"] == "echo":
            return {"allow": True}
        child: dict[str, str] = json.loads(subprocess.run(  # noqa: ASYNC221 - no env=: inherits
            [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
            timeout=30).stdout)
        report = {"environ": sorted(os.environ), "child": sorted(child),
                  "marked": sorted({name for env in (os.environ, child)
                                    for name, value in env.items() if MARKER in value})}
        return {"allow": False, "reason": "environment report",
                "user_message": json.dumps(report, separators=(",", ":"))}

    async def record(self, event: dict[str, Any]) -> None:
        pass


HOOK = _EnvironHook()
