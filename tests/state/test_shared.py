"""Two authorization servers on one database and one set of stores stand for two gateway
processes sharing a live-state store: a code issued by one is exchanged at the other, and a
token revoked at one is refused at the other from its next call."""

from __future__ import annotations

import jwt
import pytest

from proxy.oauth.keys import KeyRing
from proxy.oauth.server import AuthorizationServer, OAuthError, s256
from proxy.people.accounts import Accounts
from proxy.state import Stores, open_stores
from proxy.storage.db import Database
from tests.conftest import make_config

CALLBACK = "http://127.0.0.1:3000/cb"


def replica(database: Database, stores: Stores) -> AuthorizationServer:
    cfg = make_config(auth={"mode": "jwt"}, oauth_server={"enabled": True})
    ring = KeyRing(database, "test-secret", cfg.oauth_server.key_rotation_s,
                   cfg.oauth_server.access_token_ttl_s)
    return AuthorizationServer(cfg, database, ring, codes=stores.codes,
                               revocations=stores.revocations, consents=stores.consent_flows)


async def test_codes_and_revocations_hold_across_processes_sharing_the_store(
        database: Database) -> None:
    cfg = make_config(auth={"mode": "jwt"}, oauth_server={"enabled": True})
    # on Redis, two connections as two processes have; in memory, one store both use
    stores = open_stores(cfg)
    other = open_stores(cfg) if cfg.state.shared else stores
    try:
        await _codes_and_revocations_hold(replica(database, stores), replica(database, other),
                                          database)
    finally:
        await stores.aclose()
        await other.aclose()


async def _codes_and_revocations_hold(a: AuthorizationServer, b: AuthorizationServer,
                                      database: Database) -> None:
    resource = f"{a.issuer}/mcp/e"
    client = a.authenticate_client(
        a.register({"redirect_uris": [CALLBACK]})["client_id"], None)
    alice = Accounts(database).create_local("alice", "correct-horse")
    verifier = "v" * 50
    code = await a.issue_code(client, CALLBACK, {"code_challenge": s256(verifier)}, alice,
                              resource)
    form = {"code": code, "code_verifier": verifier, "redirect_uri": CALLBACK}
    tokens = await b.exchange_code(client, form)
    assert (await a.verify_access(tokens["access_token"], resource))["sub"] == alice.subject
    with pytest.raises(OAuthError, match="already used"):  # taken once, whichever replica
        await a.exchange_code(client, form)
    # the reuse revoked the family the code produced, on both replicas
    with pytest.raises(jwt.InvalidTokenError, match="revoked"):
        await b.verify_access(tokens["access_token"], resource)

    again = await a.issue_code(client, CALLBACK, {"code_challenge": s256(verifier)}, alice,
                               resource)
    fresh = await a.exchange_code(client, {**form, "code": again})
    assert await b.verify_access(fresh["access_token"], resource)
    await a.revoke(client, fresh["access_token"])  # an access token revoked at a ...
    with pytest.raises(jwt.InvalidTokenError, match="revoked"):
        await b.verify_access(fresh["access_token"], resource)  # ... is refused at b


async def test_without_a_shared_store_a_code_is_only_known_where_it_was_issued(
        database: Database) -> None:
    """What the memory store cannot do, stated: it is one process's state."""
    cfg = make_config(auth={"mode": "jwt"}, oauth_server={"enabled": True},
                      state={"url": "memory"})
    a, b = replica(database, open_stores(cfg)), replica(database, open_stores(cfg))
    client = a.authenticate_client(a.register({"redirect_uris": [CALLBACK]})["client_id"], None)
    alice = Accounts(database).create_local("alice", "correct-horse")
    code = await a.issue_code(client, CALLBACK, {"code_challenge": s256("v" * 50)}, alice,
                              f"{a.issuer}/mcp/e")
    with pytest.raises(OAuthError, match="invalid, expired or already used"):
        await b.exchange_code(client, {"code": code, "code_verifier": "v" * 50,
                                       "redirect_uri": CALLBACK})
