"""One opaque pagination cursor for a merged list: the members' own cursors, sealed (HMAC) and
bound to the endpoint, the list method and the caller, so a cursor forged, altered or replayed
by another caller reaches no page at all. A member's server-to-client request goes out under
an id sealed the same way (`seal_id`): the member and its own id, bound to the endpoint and
the client's gateway session (or the caller), so the client's answer finds its member on any
replica with nothing stored, and no client can reach another member's or caller's request."""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson

from proxy.errors import InvalidParams

MAC_BYTES = 16
ID_PREFIX = "tv1."  # a sealed server-to-client request id
SERVER_REQUEST = "server-request"  # in place of a list method: an id is never a cursor


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

    def seal_id(self, endpoint: str, bound: str, member: str, request_id: object) -> str:
        payload = orjson.dumps([member, request_id])
        mac = self._mac(endpoint, SERVER_REQUEST, bound, payload)
        return ID_PREFIX + _b64(payload) + "." + _b64(mac)

    def open_id(self, sealed: object, endpoint: str, bound: str) -> tuple[str, object] | None:
        """(member, the member's own id) of an id `seal_id` gave this endpoint and binding;
        None for anything else (forged, altered, another session's or caller's)."""
        if not isinstance(sealed, str) or not sealed.startswith(ID_PREFIX) or len(sealed) > 4096:
            return None
        body, dot, mac = sealed[len(ID_PREFIX):].partition(".")
        try:
            payload, given = _unb64(body), _unb64(mac)
        except ValueError:
            return None
        if not dot or not hmac.compare_digest(given, self._mac(endpoint, SERVER_REQUEST, bound,
                                                               payload)):
            return None
        opened = orjson.loads(payload)
        if not (isinstance(opened, list) and len(opened) == 2 and isinstance(opened[0], str)):
            return None
        return opened[0], opened[1]

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
