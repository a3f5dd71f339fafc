"""Every path under /oauth/ has a fixed 64 KiB body cap, declared or streamed, whatever
`max_request_bytes` says (seed 004): these routes answer before anyone signs in."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.bodycap import BodyCap

LIMIT = 65536
TOO_LARGE = orjson.dumps({"error": "invalid_request",
                          "error_description": f"request body exceeds the {LIMIT}-byte limit"})


def OAuthBodyCap(app: Any) -> BodyCap:  # noqa: N802 - reads as the middleware it builds
    return BodyCap(app, "/oauth/", LIMIT, TOO_LARGE)
