"""The connect prompt as a URL elicitation: a link to the connect page that works once, for the
caller alone, for `server.connect_link_ttl_s`.

When a per_user upstream is not connected and the client declared URL-mode elicitation, the
gateway answers the call with a link instead of seed 004's `-32000` hint: the 2025-11-25 era's
`-32042` error (`data.elicitations`, `UrlElicitationRequired`), the 2026-07-28 era's
`input_required` result (`input_required`). The link is `/connect/<upstream>?link=<token>`: the
store (a `FlowStore`, in memory or Redis: any replica serves the link) keeps it under the
token's SHA-256, bound to a digest of the caller's principal, with the upstream, the
elicitation id and when it expires (wall-clock, so every replica agrees; the store's own TTL
is the same). The connect page `peek`s it (whoever signed in must be the caller, or it is
refused, audited, and left for its owner) and `take`s it when the person goes on to the
upstream's authorization server: used once. Neither the token nor its digest is logged or
audited; a refusal names the link by `tag` (a prefix of the digest).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.connect.manager import UpstreamNeedsReconnect, UpstreamNotConnected
from proxy.errors import UpstreamFailure
from proxy.state.flows import FlowStore, ForeignFlow
from proxy.web.paths import segment

# the key an input_required result names the gateway's own request under, and the prefix of
# its requestState: a retry that carries them has them taken out before it goes upstream
INPUT_KEY = "tollhouse/connect"
STATE_PREFIX = "tollhouse-connect:"


class UrlElicitationRequired(UpstreamNotConnected):
    """2025-11-25: `-32042` with `data.elicitations` (one URL-mode elicitation: the connect
    link); audited like the `-32000` hint it stands for (upstream_not_connected, or
    upstream_needs_reconnect)."""

    code = -32042
    message = "URL elicitation required"

    def __init__(self, cause: UpstreamNotConnected, elicitation: dict[str, Any]) -> None:
        UpstreamFailure.__init__(self, str(elicitation["message"]),
                                 data={"elicitations": [elicitation]})
        self.audit_name = cause.audit_name


class LinkRefused(Exception):
    """The link cannot be used: `reason` is "foreign" (another person's: left for them) or
    "unusable" (unknown, used, expired, or another upstream's)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Link:
    elicitation_id: str
    expires_at: float


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tag(token: str) -> str:
    """What a log line or an audit record may name a link by: 8 hex digits of its digest."""
    return digest(token)[:8]


def _binding(principal: str) -> str:
    return hashlib.sha256(f"connect-link\x00{principal}".encode()).hexdigest()


def prompt(cause: UpstreamNotConnected, upstream: str) -> str:
    """The sentence the client shows the person beside the link."""
    if isinstance(cause, UpstreamNeedsReconnect):
        return f"Reconnect your {upstream} account to Tollhouse to continue."
    return f"Connect your {upstream} account to Tollhouse to continue."


class ConnectLinks:
    """Issues, checks and uses the connect links (see the module docstring)."""

    def __init__(self, store: FlowStore, public_url: str, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._public_url = public_url.rstrip("/")
        self.ttl_s = ttl_s
        self._clock = clock

    async def issue(self, upstream: str, principal: str, message: str) -> dict[str, Any]:
        """A new link for this caller: the URL-mode elicitation's params (2025-11-25's
        `ElicitRequestURLParams`: mode, elicitationId, url, message)."""
        token = secrets.token_urlsafe(32)
        elicitation_id = secrets.token_urlsafe(16)
        await self._store.put(digest(token), _binding(principal), {
            "upstream": upstream, "elicitation": elicitation_id,
            "expires_at": repr(self._clock() + self.ttl_s)})
        return {"mode": "url", "elicitationId": elicitation_id,
                "url": f"{self._public_url}/connect/{segment(upstream)}?link={token}",
                "message": message}

    async def check(self, upstream: str, token: str, principal: str) -> Link:
        """The link, still usable by this person; LinkRefused otherwise (nothing used up)."""
        return await self._read(self._store.peek, upstream, token, principal)

    async def use(self, upstream: str, token: str, principal: str) -> Link:
        """The link, used up by this person; LinkRefused otherwise (another's stays theirs)."""
        return await self._read(self._store.take, upstream, token, principal)

    async def _read(self, read: Callable[[str, str], Any], upstream: str, token: str,
                    principal: str) -> Link:
        if not token or len(token) > 100:
            raise LinkRefused("unusable")
        try:
            held: dict[str, str] | None = await read(digest(token), _binding(principal))
        except ForeignFlow:
            raise LinkRefused("foreign") from None
        if held is None or held.get("upstream") != upstream:
            raise LinkRefused("unusable")
        expires_at = float(held["expires_at"])
        if self._clock() >= expires_at:
            raise LinkRefused("unusable")
        return Link(held["elicitation"], expires_at)


def input_required(elicitation: dict[str, Any]) -> dict[str, Any]:
    """2026-07-28: the `input_required` result that asks the client for the same link (its
    URL-mode `elicitation/create` has no elicitationId in that era); the client's retry
    carries `inputResponses` and `requestState` back, which the gateway takes out
    (`without_answer`) before the call goes upstream."""
    params = {k: v for k, v in elicitation.items() if k != "elicitationId"}
    return {"resultType": "input_required",
            "inputRequests": {INPUT_KEY: {"method": "elicitation/create", "params": params}},
            "requestState": STATE_PREFIX + str(elicitation["elicitationId"])}


def answers_link(params: dict[str, Any] | None) -> bool:
    """A 2026-07-28 retry that answers the gateway's own input request."""
    if params is None:
        return False
    state = params.get("requestState")
    return isinstance(state, str) and state.startswith(STATE_PREFIX)


def without_answer(params: dict[str, Any]) -> dict[str, Any]:
    """The retry's params as the upstream takes them: the gateway's requestState and its
    input response out (any other input response, the upstream's own, kept)."""
    out = {k: v for k, v in params.items() if k != "requestState"}
    responses = out.pop("inputResponses", None)
    if isinstance(responses, dict):
        kept = {k: v for k, v in responses.items() if k != INPUT_KEY}
        if kept:
            out["inputResponses"] = kept
    return out
