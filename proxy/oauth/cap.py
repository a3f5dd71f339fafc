"""Every path under /oauth/ has a fixed 64 KiB body cap, declared or streamed, whatever
`max_request_bytes` says (seed 004): these routes answer before anyone signs in."""

from __future__ import annotations

from typing import Any

from proxy.bodycap import BodyCap

LIMIT = 65536


def OAuthBodyCap(app: Any) -> BodyCap:
    return BodyCap(app, "/oauth/", LIMIT, "oauth")
