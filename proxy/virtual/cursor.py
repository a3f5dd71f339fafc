"""One opaque pagination cursor for a merged list: the members' own cursors, sealed (HMAC) and
bound to the endpoint, the list method and the caller, so a cursor forged, altered or replayed
by another caller reaches no page at all."""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson

from proxy.errors import InvalidParams

MAC_BYTES = 16


class Cursors:
    def __init__(self, key: bytes) -> None:
        self._key = hashlib.sha256(b"tollhouse virtual cursor\0" + key).digest()

    def seal(self, endpoint: str, method: str, caller: str, pending: dict[str, str]) -> str:
        payload = orjson.dumps(pending, option=orjson.OPT_SORT_KEYS)
        mac = self._mac(endpoint, method, caller, payload)
        return _b64(payload) + "." + _b64(mac)

    def open(self, cursor: object, endpoint: str, method: str, caller: str) -> dict[str, str]:
        """The members' cursors in `cursor`; InvalidParams for anything this caller was not
        given on this endpoint for this list."""
        if not isinstance(cursor, str) or len(cursor) > 16384:
            raise InvalidParams("Invalid cursor")
        body, dot, mac = cursor.partition(".")
        try:
            payload, given = _unb64(body), _unb64(mac)
        except ValueError:
            raise InvalidParams("Invalid cursor") from None
        if not dot or not hmac.compare_digest(given, self._mac(endpoint, method, caller,
                                                               payload)):
            raise InvalidParams("Invalid cursor")
        pending = orjson.loads(payload)
        if not isinstance(pending, dict) or not all(isinstance(v, str) for v in
                                                    pending.values()):
            raise InvalidParams("Invalid cursor")
        return pending

    def _mac(self, endpoint: str, method: str, caller: str, payload: bytes) -> bytes:
        bound = f"{endpoint}\0{method}\0{caller}\0".encode() + payload
        return hmac.new(self._key, bound, hashlib.sha256).digest()[:MAC_BYTES]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise ValueError("not base64") from None
