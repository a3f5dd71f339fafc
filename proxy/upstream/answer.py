"""An upstream's answer as everything above `proxy/upstream/` sees it, and the httpx boundary on
the way back, so that no httpx type or exception leaves this package.

`UpstreamAnswer` is what `UpstreamClient.open` returns: the status, the headers, the body as it
arrives (`chunks`) or whole (`aread`), and `aclose`. `map_errors` turns every httpx failure
into the GatewayError that names it; `BodyChunks` and `read_head` read a body with those
failures mapped; `rejection` reads an upstream's own JSON-RPC refusal in a 4xx answer as the
error to relay.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import httpx
import orjson

from proxy.errors import (
    NO_ID,
    ResponseTooLarge,
    UpstreamFailure,
    UpstreamRejected,
    UpstreamStreamCut,
    UpstreamTimeout,
    UpstreamUnavailable,
)


@contextlib.contextmanager
def map_errors() -> Iterator[None]:
    """httpx exceptions never escape: each becomes the UpstreamFailure that names it."""
    try:
        yield
    except httpx.TimeoutException:
        raise UpstreamTimeout() from None
    except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.ProxyError):
        raise UpstreamUnavailable() from None
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.StreamError):
        raise UpstreamStreamCut("upstream connection broke") from None
    except httpx.HTTPError:
        raise UpstreamFailure() from None


class UpstreamAnswer:
    """An upstream's answer, open once its headers are in; whoever holds it closes it
    (`aclose`, safe to call again). `headers` is case-insensitive. A thin wrapper over the
    transport's response, on every call's path: one allocation, nothing read or copied, and
    `aclose` the response's own (no second coroutine to await)."""

    __slots__ = ("_response", "aclose", "headers", "status_code")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code: int = response.status_code
        self.headers: Mapping[str, str] = response.headers
        self.aclose: Callable[[], Awaitable[None]] = response.aclose

    def chunks(self) -> BodyChunks:
        """The body as it arrives (read once)."""
        return BodyChunks(self._response)

    async def aread(self) -> bytes:
        """The whole body; a broken read is the UpstreamFailure naming it."""
        with map_errors():
            return await self._response.aread()


class BodyChunks:
    """An upstream answer's body as it arrives, chunk by chunk, with every httpx failure
    mapped here: what a stream relay reads, so no httpx exception reaches it."""

    __slots__ = ("_chunks",)

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_bytes()

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        with map_errors():
            return await self._chunks.__anext__()


async def read_head(answer: UpstreamAnswer, head: int, limit: int | None
                    ) -> tuple[bytes, BodyChunks | None]:
    """An answer's body up to `head` bytes: (the whole body, None) when it ends there, else
    (what was read, the rest still to come). With `limit`, the body is read whole however
    large `head` says, and one over `limit` bytes is refused (`ResponseTooLarge`)."""
    declared = answer.headers.get("content-length", "")
    if limit is not None and declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge(limit)
    chunks = BodyChunks(answer._response)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if limit is not None and size > limit:
            raise ResponseTooLarge(limit)
        if limit is None and size > head:
            return b"".join(parts), chunks
    return b"".join(parts), None


# An upstream error body is read whole only up to this size: past it, it is not relayed.
ERROR_BODY_CAP = 64 * 1024
_RETRY_AFTER = re.compile(r"[0-9]{1,10}|[A-Za-z]{3}, [0-9]{2} [A-Za-z]{3} [0-9]{4} "
                          r"[0-9]{2}:[0-9]{2}:[0-9]{2} GMT")
NO_CALL = object()


async def rejection(answer: UpstreamAnswer, *, call_id: Any = NO_CALL,
                    modern: bool = False) -> UpstreamRejected | None:
    """The upstream's own JSON-RPC error in a 4xx answer, as the error to relay, or None when
    the answer is an upstream failure instead: another status, a body that is not JSON, too
    large, cut, or not a JSON-RPC error (for a call: not one for `call_id`). The caller closes
    the answer."""
    status = answer.status_code
    if not 400 <= status < 500:
        return None
    call = call_id is not NO_CALL
    ctype = answer.headers.get("content-type", "")
    if ctype != "application/json" and \
            ctype.partition(";")[0].strip().lower() != "application/json":
        return None
    try:
        data = await _read_capped(answer._response, ERROR_BODY_CAP)
    except UpstreamFailure:
        return None
    try:
        obj = orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0" or "result" in obj:
        return None
    error = obj.get("error")
    if not isinstance(error, dict):
        return None
    code, message = error.get("code"), error.get("message")
    if type(code) is not int or not isinstance(message, str):
        return None
    if call and ("id" not in obj or type(obj["id"]) is not type(call_id)
                 or obj["id"] != call_id):
        return None
    kept = UpstreamRejected.status_for(status, code, modern=modern, call=call)
    if kept is None:
        return None
    out: dict[str, Any] = {"code": code, "message": message}
    if "data" in error:
        out["data"] = error["data"]
    retry_after = answer.headers.get("retry-after") if kept == 429 else None
    if retry_after is not None and not _RETRY_AFTER.fullmatch(retry_after.strip()):
        retry_after = None
    return UpstreamRejected(out, kept, call=call, upstream_id=obj.get("id", NO_ID),
                            retry_after=retry_after.strip() if retry_after else None)


async def _read_capped(response: httpx.Response, cap: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    with map_errors():
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > cap:
                return None
            chunks.append(chunk)
    return b"".join(chunks)
