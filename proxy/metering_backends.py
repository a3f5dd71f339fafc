"""The metering hook's two backends, built from `[metering]` by `build_backend`: an in-process
Python object (`metering.hook = "module:object"`, `PythonHook`) and a signed webhook
(`Webhook`). `policies.metering` asks a backend whether a call may go (authorize); the outbox
worker (`proxy.audit.outbox`) hands it each usage event (record). The webhook's contract is
fixed: a JSON POST signed with `X-Tollhouse-Signature: sha256=<hex HMAC-SHA256 of the body>`.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import logging
from typing import Any

import httpx
import orjson

from policies.metering import MeteringBackend
from proxy.config import MeteringConfig

log = logging.getLogger("tollhouse.metering")


class PythonHook:
    """`metering.hook = "module:object"`: an object with async authorize() and record().
    In process: the outbox worker hands it each usage event as its call ends (`deliver_now`)."""

    in_process = True

    def __init__(self, spec: str) -> None:
        module, _, name = spec.partition(":")
        target = getattr(importlib.import_module(module), name)
        for method in ("authorize", "record"):
            if not callable(getattr(target, method, None)):
                raise ValueError(f"metering hook {spec} has no {method}()")  # noqa: TRY004
        self._target = target
        self.record = target.record  # the hook's own: no coroutine of ours around it

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return dict(await self._target.authorize(request))


class Webhook:
    in_process = False

    def __init__(self, url: str, secret: str, http: httpx.AsyncClient, timeout_s: float) -> None:
        self._url = url
        self._key = secret.encode()
        self._http = http
        self._timeout_s = timeout_s

    def sign(self, body: bytes) -> str:
        return "sha256=" + hmac.new(self._key, body, hashlib.sha256).hexdigest()

    async def _post(self, payload: dict[str, Any], timeout_s: float) -> httpx.Response:
        body = orjson.dumps(payload)
        return await self._http.post(self._url, content=body, timeout=timeout_s, headers={
            "content-type": "application/json", "x-tollhouse-signature": self.sign(body)})

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        response = await self._post({"type": "authorize", **request}, self._timeout_s)
        if response.status_code != 200:
            raise ValueError(f"authorize answered HTTP {response.status_code}")
        answer = response.json()
        if not isinstance(answer, dict):
            raise ValueError("authorize answered no object")  # noqa: TRY004 - a bad answer
        return answer

    async def record(self, event: dict[str, Any]) -> None:
        response = await self._post(event, max(self._timeout_s, 5.0))
        if not 200 <= response.status_code < 300:
            raise ValueError(f"usage answered HTTP {response.status_code}")


def build_backend(cfg: MeteringConfig, http: httpx.AsyncClient) -> MeteringBackend:
    if cfg.hook:
        return PythonHook(cfg.hook)
    return Webhook(cfg.url, cfg.secret, http, cfg.timeout_ms / 1000)
