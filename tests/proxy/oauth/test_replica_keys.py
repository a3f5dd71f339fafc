"""Item 4, the signing keys: two authorization servers on one database stand for two gateway
replicas. A key minted by one verifies at the other at once (an unknown kid reads the table
again), is in the other's JWKS within its refresh interval, is adopted rather than minted
again when the other's rotation falls due, and is published before it signs. Made-up kids
read the table at most once per interval."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import jwt
import pytest

from proxy.oauth.keys import KeyRing
from proxy.oauth.server import AuthorizationServer, s256
from proxy.people.accounts import Accounts, User
from proxy.state import open_stores
from proxy.storage.db import Database
from tests.conftest import make_config
from tests.helpers import Clock

ROTATION_S = 86400.0
TTL_S = 300.0


def ring(database: Database, clock: Clock, **options: float) -> KeyRing:
    return KeyRing(database, "test-secret", ROTATION_S, TTL_S, clock=clock, **options)


def server(database: Database, keys: KeyRing) -> AuthorizationServer:
    # the live state is not what these tests are about: in memory, nothing to close
    cfg = make_config(auth={"mode": "jwt"}, oauth_server={"enabled": True},
                      state={"url": "memory"})
    stores = open_stores(cfg)
    return AuthorizationServer(cfg, database, keys, codes=stores.codes,
                               revocations=stores.revocations, consents=stores.consent_flows)


async def granted(server: AuthorizationServer, user: User, resource: str) -> dict[str, Any]:
    """Tokens as a client gets them from `server`: a code for `user`, exchanged."""
    callback, verifier = "http://127.0.0.1:3000/cb", "v" * 50
    client = server.client(server.register({"redirect_uris": [callback]})["client_id"])
    assert client is not None
    code = await server.issue_code(client, callback, {"code_challenge": s256(verifier)}, user,
                                   resource)
    return await server.exchange_code(client, {"code": code, "code_verifier": verifier,
                                               "redirect_uri": callback})


def kids(keys: KeyRing) -> set[str]:
    return {k["kid"] for k in keys.jwks()["keys"]}


def stored(database: Database) -> int:
    with database.transaction() as conn:
        return int(conn.execute("SELECT COUNT(*) FROM oauth_keys", ()).fetchone()[0])


async def test_a_token_signed_with_a_key_minted_on_one_replica_verifies_on_the_other_at_once(
        database: Database) -> None:
    # no publication lead here: the new key signs the moment it is minted, the worst case
    a_clock, b_clock = Clock(), Clock()
    a = server(database, ring(database, a_clock, publish_lead_s=0))
    b = server(database, ring(database, b_clock, publish_lead_s=0))
    assert kids(a.keys) == kids(b.keys)  # b adopted the key a minted on the empty table
    first = a.keys.current.kid
    assert b.keys.current.kid == first and stored(database) == 1

    with database.transaction() as conn:  # a day passes: the key is due for rotation
        conn.execute(database.sql("UPDATE oauth_keys SET created_at = created_at - ?"),
                     (ROTATION_S + 1,))
    a_clock.advance(60)  # a reads the table again (its refresh interval) and rotates
    user = Accounts(database).create_local("ann", "ann-password")
    resource = f"{a.issuer}/mcp/e"
    token = (await granted(a, user, resource))["access_token"]
    assert a.keys.current.kid != first and stored(database) == 2
    assert jwt.get_unverified_header(token)["kid"] == a.keys.current.kid
    b_clock.advance(1.0)  # b last read the table when it started, a second ago
    reads = b.keys.reads
    assert (await b.verify_access(token, resource))["sub"] == user.subject
    assert b.keys.reads == reads + 1
    assert await b.keys.public_key(a.keys.current.kid) is not None  # known now: no read
    assert b.keys.reads == reads + 1


async def test_a_replicas_jwks_lists_a_key_minted_elsewhere_after_its_refresh_interval(
        database: Database) -> None:
    a_clock, b_clock = Clock(), Clock()
    a, b = ring(database, a_clock, refresh_s=60), ring(database, b_clock, refresh_s=60)
    a.rotate_if_due(time.time() + ROTATION_S + 1)
    new = a._keys[-1].kid
    assert new in kids(a) and new not in kids(b)
    b_clock.advance(59.9)
    assert new not in kids(b) and new not in {k["kid"] for k in (await b.published())["keys"]}
    b_clock.advance(0.1)
    assert new in kids(b)
    b_clock.advance(60)
    assert new in {k["kid"] for k in (await b.published())["keys"]}


async def test_a_due_rotation_adopts_the_key_another_replica_minted(
        database: Database) -> None:
    a, b = ring(database, Clock()), ring(database, Clock())
    later = time.time() + ROTATION_S + 1
    a.rotate_if_due(later)
    assert stored(database) == 2
    b.rotate_if_due(later)  # b's own view says due; the table says a rotated already
    assert stored(database) == 2
    assert kids(b) == kids(a) and b._keys[-1].kid == a._keys[-1].kid
    assert b.current.kid == a.current.kid  # and both sign with the same key


async def test_a_new_key_is_published_before_it_signs(database: Database) -> None:
    lead = 360.0
    a = ring(database, Clock(), publish_lead_s=lead)
    old = a.current.kid
    at = time.time() + ROTATION_S + 1
    a.rotate_if_due(at)
    new = a._keys[-1].kid
    assert new != old and new in kids(a)
    assert a.current.kid == old  # published now, signing only once every cache can have it
    a.rotate_if_due(at + lead - 1)
    assert a.current.kid == old
    a.rotate_if_due(at + lead)
    assert a.current.kid == new


async def test_a_long_idle_spell_keeps_the_old_key_until_the_new_one_is_published(
        database: Database) -> None:
    """Rotating after days without a token deletes the keys too old to matter, but not the
    one that goes on signing while the new key is published."""
    a = ring(database, Clock(), publish_lead_s=360)
    old = a.current.kid
    a.rotate_if_due(time.time() + 10 * ROTATION_S)
    assert a.current.kid == old and stored(database) == 2
    b = ring(database, Clock(), publish_lead_s=360)
    assert b.public(old) is not None


async def test_made_up_kids_read_the_table_at_most_once_per_interval(
        database: Database) -> None:
    clock = Clock()
    b = ring(database, clock, reread_min_s=1.0)
    assert await b.public_key("garbage") is None  # read at start, not again within 1 s
    clock.advance(1.0)
    reads = b.reads
    results = await asyncio.gather(*(b.public_key(f"garbage-{i}") for i in range(200)))
    assert results == [None] * 200
    assert all(b.public(f"sync-garbage-{i}") is None for i in range(50))
    assert b.reads == reads + 1
    clock.advance(0.99)
    assert await b.public_key("garbage") is None and b.public("garbage") is None
    assert b.reads == reads + 1
    clock.advance(0.01)
    assert await b.public_key("garbage") is None
    assert b.public("garbage") is None
    assert b.reads == reads + 2


async def test_a_key_sealed_under_another_secret_is_left_out_after_start(
        database: Database, caplog: pytest.LogCaptureFixture) -> None:
    """A replica started with the wrong secret mints a key this one cannot open: it is left
    out here (logged by kid, never the secret), and verification goes on."""
    clock = Clock()
    mine = ring(database, clock)
    theirs = KeyRing(database, "test-secret", ROTATION_S, TTL_S)
    theirs._aead = type(theirs._aead)(b"\x00" * 32)  # as if started with another secret
    theirs._mint(time.time() + ROTATION_S + 1)
    stranger = theirs._keys[-1].kid
    clock.advance(1.0)
    assert mine.public(stranger) is None
    assert mine.public(mine.current.kid) is not None
    assert stranger in caplog.text and "test-secret" not in caplog.text
