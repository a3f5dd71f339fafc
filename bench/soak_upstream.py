"""The soak's upstream: the test suite's official-SDK MCP server (tests/e2e/upstreams.py:
echo, slow_progress, ask_sampling, wait_forever, boom, ...) on Hypercorn, as its own process
so that bench/soak.py can kill it (SIGKILL) and start it again on the same port.

    python bench/soak_upstream.py --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests.e2e

from hypercorn.asyncio import serve
from hypercorn.config import Config

from tests.e2e.upstreams import stateful_sse_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app, _probe = stateful_sse_app()
    cfg = Config()
    cfg.bind = [f"127.0.0.1:{args.port}"]
    cfg.accesslog = None
    cfg.graceful_timeout = 1
    asyncio.run(serve(app, cfg))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
