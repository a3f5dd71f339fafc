"""A caller as every later step sees it: subject, groups, scopes, the API key (if any), the
actor acting for the subject (if any), and the `key` that sessions, in-flight calls, rate limits
and per-user tokens are scoped by."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["anonymous", "jwt", "api_key"]


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller, as every later step sees it."""

    subject: str
    issuer: str = ""
    display_name: str = ""
    groups: frozenset[str] = field(default_factory=frozenset)
    scopes: frozenset[str] = field(default_factory=frozenset)
    kind: Kind = "jwt"
    api_key_id: str | None = None
    key_endpoints: frozenset[str] = field(default_factory=frozenset)  # empty: every endpoint
    role: str = ""
    # the token's claims a per-caller upstream URL is filled from (proxy.config.template),
    # as text; only those the config names are kept
    claims: tuple[tuple[str, str], ...] = ()
    # who acts for the subject (RFC 8693 `act`): an agent client's subject, `client:<id>`,
    # on a token issued by token exchange; empty when the subject calls for itself
    actor: str = ""

    def claim(self, name: str) -> str | None:
        for key, value in self.claims:
            if key == name:
                return value
        return None

    @property
    def authenticated(self) -> bool:
        return self.kind != "anonymous"

    @property
    def key(self) -> str:
        """A stable identity across issuers, for binding sessions and in-flight calls."""
        return f"{self.issuer}|{self.subject}"


# the issuer of a machine client's own tokens (client credentials): its subject is
# `client:<client_id>` (proxy.oauth.grants)
CLIENT_ISSUER = "tollhouse:client"

ANONYMOUS = Principal(subject="anonymous", kind="anonymous")
