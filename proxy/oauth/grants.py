"""The token endpoint's grants for registered confidential clients (proxy.oauth.machines):

- `client_credentials` (RFC 6749 section 4.4): a token naming the client itself
  (`client:<client_id>` under CLIENT_ISSUER), with the roles the administrator gave it;
- the JWT bearer grant (RFC 7523 section 2.1) with an Identity Assertion JWT Authorization
  Grant from a configured enterprise IdP (the MCP enterprise-managed-authorization
  extension): a token naming the person the assertion names, with no consent screen;
- token exchange (RFC 8693): a person's access token from this server, presented by an agent
  client, becomes a token naming the person and carrying `act` (the agent), so the audit,
  rate limits, metering and policies tell the agent apart from the person.

Every token is for one endpoint (RFC 8707 `resource` → `aud`), one the client may have; none
comes with a refresh token (the client asks again with what it asked with). Each grant is
the client's only if the administrator listed it in the client's `grant_types`
(`unauthorized_client` otherwise)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import jwt

from proxy.auth.principal import CLIENT_ISSUER
from proxy.errors import OAuthError
from proxy.oauth.machines import Assertions, Machine, MachineClients
from proxy.oauth.tokens import Holder, TokenLedger
from proxy.people.accounts import LINK_CLAIMS, Accounts, User

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
CLIENT_CREDENTIALS = "client_credentials"
GRANT_TYPES = (CLIENT_CREDENTIALS, JWT_BEARER, TOKEN_EXCHANGE)


class Grants:
    """`endpoint_of` maps a resource URL to the endpoint it names (None: not one served now);
    `verify_access` is the authorization server's own check of its access tokens."""

    def __init__(self, ledger: TokenLedger, machines: MachineClients, assertions: Assertions,
                 endpoint_of: Callable[[str], str | None],
                 verify_access: Callable[[str, str], Any]) -> None:
        self._ledger = ledger
        self.machines = machines
        self._assertions = assertions
        self._endpoint_of = endpoint_of
        self._verify_access = verify_access

    def _machine(self, client_id: str, grant_type: str) -> Machine:
        machine = self.machines.get(client_id)
        if machine is None or not machine.may(grant_type):
            raise OAuthError("unauthorized_client", f"this client may not use the grant "
                             f"{grant_type}: an administrator lists it in the client's "
                             "grant_types")
        return machine

    def _resource(self, machine: Machine, resource: str) -> str:
        endpoint = self._endpoint_of(resource) if resource else None
        if endpoint is None:
            raise OAuthError("invalid_target", "resource must name one of this gateway's "
                             "endpoints (RFC 8707)")
        if not machine.serves(endpoint):
            raise OAuthError("invalid_target", f"this client may not have tokens for the "
                             f"endpoint {endpoint}")
        return resource

    async def client_credentials(self, client_id: str, form: dict[str, str]
                                 ) -> dict[str, Any]:
        machine = self._machine(client_id, CLIENT_CREDENTIALS)
        resource = self._resource(machine, form.get("resource", ""))
        who = Holder(machine.subject, CLIENT_ISSUER, machine.name, machine.roles)
        return await asyncio.to_thread(self._ledger.access_only, client_id, who, resource)

    async def identity_assertion(self, client_id: str, form: dict[str, str],
                                 accounts: Accounts) -> dict[str, Any]:
        """An ID-JAG through the JWT bearer grant: the person it names, found (or made, as a
        federated sign-in makes them; a provisioned person is linked by the sign-in's rule)
        under the IdP's issuer."""
        machine = self._machine(client_id, JWT_BEARER)
        idp, claims = await self._assertions.verified(form.get("assertion", ""), client_id)
        asserted, asked = claims.get("resource"), form.get("resource")
        if asserted is not None and not isinstance(asserted, str):
            raise OAuthError("invalid_grant", "the assertion's resource is not one URL")
        if asserted and asked and asserted != asked:
            raise OAuthError("invalid_target", "the resource asked for is not the one the "
                             "assertion grants")
        resource = self._resource(machine, asserted or asked or "")
        name = claims.get(idp.name_claim)
        groups_claim = claims.get(idp.groups_claim) if idp.groups_claim else None
        groups = frozenset(g for g in groups_claim if isinstance(g, str) and g) \
            if isinstance(groups_claim, list) else None
        user = await asyncio.to_thread(
            _person, accounts, idp.issuer, claims, name if isinstance(name, str) else "",
            groups)
        who = Holder(user.subject, user.issuer, user.name, user.groups, user.id)
        return await asyncio.to_thread(self._ledger.access_only, client_id, who, resource)

    async def exchange(self, client_id: str, form: dict[str, str],
                       accounts: Accounts) -> dict[str, Any]:
        """RFC 8693: the agent (the authenticated client) presents a person's access token
        from this server; the answer is a token naming the person, `act` naming the agent."""
        machine = self._machine(client_id, TOKEN_EXCHANGE)
        if form.get("subject_token_type") != ACCESS_TOKEN_TYPE:
            raise OAuthError("invalid_request", f"subject_token_type must be {ACCESS_TOKEN_TYPE}"
                             " (an access token this server issued)")
        if form.get("actor_token") or form.get("actor_token_type"):
            raise OAuthError("invalid_request", "actor_token is not taken: the actor is the "
                             "client that authenticates")
        if form.get("requested_token_type") not in (None, "", ACCESS_TOKEN_TYPE):
            raise OAuthError("invalid_request", f"requested_token_type may only be "
                             f"{ACCESS_TOKEN_TYPE}")
        claims = await self._subject(form.get("subject_token", ""))
        user = await asyncio.to_thread(accounts.get, str(claims.get("uid", "")))
        if user is None or not user.active:
            raise OAuthError("invalid_grant", "the subject token's person no longer exists or "
                             "is deactivated")
        resource = self._resource(machine, form.get("resource") or str(claims["aud"]))
        act: dict[str, Any] = {"sub": machine.subject, "client_id": client_id}
        if isinstance(claims.get("act"), dict):
            act["act"] = claims["act"]  # RFC 8693 section 4.1: the earlier actors, nested
        who = Holder(user.subject, user.issuer, user.name, user.groups, user.id)
        answer = await asyncio.to_thread(self._ledger.access_only, client_id, who, resource,
                                         act=act, not_after=float(claims["exp"]))
        return {**answer, "issued_token_type": ACCESS_TOKEN_TYPE}

    async def _subject(self, token: str) -> dict[str, Any]:
        """The claims of a person's access token from this server, for any endpoint."""
        try:
            aud = jwt.decode(token, options={"verify_signature": False}).get("aud")
        except jwt.PyJWTError:
            raise OAuthError("invalid_grant", "the subject token is not a JWT") from None
        if not isinstance(aud, str) or self._endpoint_of(aud) is None:
            raise OAuthError("invalid_grant", "the subject token is not one this server "
                             "issued for one of its endpoints")
        try:
            claims: dict[str, Any] = await self._verify_access(token, aud)
        except jwt.ExpiredSignatureError:
            raise OAuthError("invalid_grant", "the subject token expired") from None
        except jwt.PyJWTError:
            raise OAuthError("invalid_grant", "the subject token is invalid or revoked") \
                from None
        if claims.get("tollhouse_iss") == CLIENT_ISSUER or "uid" not in claims:
            raise OAuthError("invalid_grant", "the subject token must name a person, not a "
                             "client")
        return claims


def _person(accounts: Accounts, issuer: str, claims: dict[str, Any], name: str,
            groups: frozenset[str] | None) -> User:
    """The person an assertion names (a database step): linked if provisioned, made on first
    sight like a federated sign-in; refused when deactivated."""
    subject = str(claims["sub"])
    accounts.link(issuer, subject, [str(claims[c]) for c in LINK_CLAIMS
                                    if isinstance(claims.get(c), str)])
    held = accounts.by_subject(issuer, subject)  # an administrator stays one
    user = accounts.upsert_federated(issuer, subject, name or subject, groups,
                                     admin=held is not None and held.is_admin)
    if not user.active:
        raise OAuthError("invalid_grant", "the person the assertion names is deactivated")
    return user
