"""The console's one way to its data: a request to this gateway's own /api/v1, in process
(httpx's ASGI transport calls the app; no socket, no private endpoint). It carries the
person's cookie, this gateway's Origin and their address, so /api/v1 authenticates, checks,
answers and audits exactly as for a script; the console only renders what comes back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from quart import current_app, request

from proxy.people.signin import COOKIE, Web

FORWARDED = ("X-Forwarded-For", "X-Forwarded-Proto", "User-Agent")


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the decoded JSON, or None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def detail(self) -> str:
        """What went wrong, in words for the page: the API's `detail`."""
        detail = self.body.get("detail") if isinstance(self.body, dict) else None
        if isinstance(detail, list):
            return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: "
                             f"{d.get('msg', '')}" for d in detail if isinstance(d, dict))
        if isinstance(detail, str):
            return detail
        if isinstance(self.body, dict) and "error_description" in self.body:
            return str(self.body["error_description"])
        return f"HTTP {self.status}"


async def call(web: Web, method: str, path: str, *, json: Any = None,
               params: Mapping[str, str | list[str]] | None = None) -> Answer:
    """`method path` (under /api/v1) as the person of this request (a list in `params`: the
    parameter once per item)."""
    headers = {h: request.headers[h] for h in FORWARDED if h in request.headers}
    headers["Origin"] = web.origin
    headers["Host"] = request.host
    cookie = request.cookies.get(COOKIE, "")
    content = orjson.dumps(json) if json is not None else None
    if content is not None:
        headers["Content-Type"] = "application/json"
    app: Any = current_app  # Quart's typed ASGI signature is narrower than httpx's
    transport = httpx.ASGITransport(app=app, client=(request.remote_addr or
                                                            "127.0.0.1", 0))
    if cookie:
        headers["Cookie"] = f"{COOKIE}={cookie}"
    async with httpx.AsyncClient(transport=transport, base_url=web.origin) as client:
        response = await client.request(method, "/api/v1" + path, content=content,
                                        params=params, headers=headers)
    try:
        body = orjson.loads(response.content) if response.content else None
    except orjson.JSONDecodeError:
        body = None
    return Answer(response.status_code, body)
