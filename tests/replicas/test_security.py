"""Item 4: security state is shared at once, with two `tollhouse serve` processes on one Redis
and one database behind HAProxy (`tests/replicas/harness.py`).

One cluster serves the whole module: the gateway's own OAuth server (signing keys rotated
every `ROTATION_S`), sign-in through an OpenID provider, and beside `up` a per_user upstream
`gh` whose authorization server (`tests/e2e/oidc_provider.py` with its refresh grant) the
test holds and counts. Browser steps and token requests go to each replica's own address
(`Replica.url`) in turn, sending the Origin a browser at the load balancer's address would,
so which replica served each step is the address it went to; MCP calls go through HAProxy,
whose log names the replica that served each.

How a key rotates today: nothing but the token endpoint (and start-up) rotates. Each token
it issues calls `KeyRing.rotate_if_due`, which mints a key once the newest stored one is
`oauth_server.key_rotation_s` old (no CLI command rotates). The bound tested is the docs':
a key minted on one replica is in every replica's JWKS from `min(60 s, key_rotation_s)` after
it was stored, and signs, on every replica, once published for `min(360 s, key_rotation_s /
2)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import jwt
import orjson
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from proxy.connect.vault import Vault, keys_from_env
from proxy.people.accounts import Accounts
from proxy.storage.db import Database
from tests import db_backends
from tests.e2e.oidc_provider import OidcProvider, running_provider
from tests.e2e.test_oauth_sdk import MCP_HEADERS, REDIRECT_URI, Browser, query, s256
from tests.e2e.upstreams import UpstreamProbe, stateless_json_app
from tests.helpers import DEADLINE_S, until
from tests.replicas.harness import Cluster, Replica, Served, open_cluster
from tests.servers import serve

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET_KEY = "replicas-secret-key-of-at-least-32-bytes"
ROTATION_S = 4  # oauth_server.key_rotation_s: keys are read again every 4 s, sign after 2 s
PEOPLE = {"alice": "alice-pass-123", "bob": "bob-pass-1234"}


@dataclass
class World:
    cluster: Cluster
    probe: UpstreamProbe  # the MCP upstream behind both `up` and `gh`
    idp: OidcProvider  # where people sign in
    gh_as: OidcProvider  # gh's authorization server
    database_url: str

    @property
    def public(self) -> str:
        """The gateway's public URL (the load balancer's): issuer, Origin, redirect URIs."""
        return self.cluster.lb_url

    @property
    def replicas(self) -> list[Replica]:
        return self.cluster.replicas

    def resource(self, endpoint: str = "up") -> str:
        return f"{self.public}/mcp/{endpoint}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    databases = db_backends.TestDatabases()  # the module's own: it outlives each test's
    try:
        url = databases.url("replicas")
        with Database(url) as database:
            for person, password in PEOPLE.items():
                Accounts(database).create_local(person, password)
        app, probe = stateless_json_app()
        idp, gh_as = OidcProvider(), OidcProvider(client_id="gh-client", refresh_grant=True)
        async with serve(app, graceful_timeout=1) as upstream_url, \
                running_provider(idp) as idp_url, running_provider(gh_as) as gh_as_url:
            config = {
                # the refusals below all come from one address: no lockout in their way
                "auth": {"mode": "jwt", "lockout": {"max_failures": 10_000},
                         "oidc": {"issuer": idp_url, "client_id": idp.client_id,
                                  "client_secret": idp.client_secret}},
                "oauth_server": {"enabled": True, "key_rotation_s": ROTATION_S},
                "upstreams": [{"name": "gh", "url": f"{upstream_url}/mcp", "auth": "per_user",
                               "oauth": {"client_id": gh_as.client_id,
                                         "client_secret": gh_as.client_secret,
                                         "authorization_endpoint": f"{gh_as_url}/authorize",
                                         "token_endpoint": f"{gh_as_url}/token",
                                         "scopes": ["openid"]}}]}
            async with open_cluster(tmp_path_factory.mktemp("security"), upstream_url,
                                    config=config, database_url=url,
                                    env={"TOLLHOUSE_SECRET_KEY": SECRET_KEY}) as cluster:
                yield World(cluster, probe, idp, gh_as, url)
    finally:
        databases.close()


# -- a browser and an OAuth client, each request to the next replica ----------------------------


def on(replica: Replica, url: str) -> str:
    """`url` (any base) at `replica`'s own address."""
    parts = urlsplit(url)
    return f"{replica.url}{parts.path}" + (f"?{parts.query}" if parts.query else "")


@dataclass
class Crossing(Browser):
    """The e2e Browser (`base` is the public URL, so its Origin is the gateway's) whose every
    request goes to the next of `replicas` in turn: a flow that takes several steps is
    started on one replica and carried on by the other. `served` is (replica, method, path,
    status) of each step."""

    replicas: list[Replica] = field(default_factory=list)
    served: list[tuple[str, str, str, int]] = field(default_factory=list)

    async def _go(self, method: str, url: str, **kw: Any) -> httpx.Response:
        replica = self.replicas[len(self.served) % len(self.replicas)]
        response = await self.http.request(method, on(replica, url), **kw)
        path = urlsplit(url).path
        self.served.append((replica.name, method, path, response.status_code))
        self.trail.append((method, path, response.status_code))
        return response


@contextlib.asynccontextmanager
async def person(w: World, name: str, start: int = 0) -> AsyncIterator[Crossing]:
    """`name` at a browser of their own, its first request to replica `start`."""
    async with httpx.AsyncClient(follow_redirects=False, timeout=10) as http:
        browser = Crossing(w.public, http, user=name, password=PEOPLE[name],
                           replicas=w.replicas[start:] + w.replicas[:start])
        yield browser


async def register(w: World, http: httpx.AsyncClient, replica: Replica) -> str:
    """A public client (PKCE, no secret) registered at `replica`; its id."""
    r = await http.post(f"{replica.url}/oauth/register", json={
        "client_name": "replica test", "redirect_uris": [REDIRECT_URI],
        "token_endpoint_auth_method": "none"})
    assert r.status_code == 201, r.text
    return str(r.json()["client_id"])


def authorize_url(w: World, client_id: str, verifier: str, endpoint: str = "up") -> str:
    return f"{w.public}/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT_URI,
        "state": "st-1", "resource": w.resource(endpoint), "code_challenge_method": "S256",
        "code_challenge": s256(verifier)})


def exchange(w: World, client_id: str, code: str, verifier: str) -> dict[str, str]:
    return {"grant_type": "authorization_code", "client_id": client_id, "code": code,
            "redirect_uri": REDIRECT_URI, "code_verifier": verifier}


async def code(w: World, browser: Crossing, client_id: str, verifier: str,
               endpoint: str = "up") -> str:
    back = query(await browser.consent(authorize_url(w, client_id, verifier, endpoint)))
    assert back["state"] == "st-1" and back["iss"] == w.public
    return back["code"]


@dataclass
class Grant:
    client_id: str
    access_token: str
    refresh_token: str


async def grant(w: World, name: str, endpoint: str = "up") -> Grant:
    """`name`'s tokens for `endpoint`, through sign-in and consent across both replicas."""
    async with person(w, name) as browser:
        client_id = await register(w, browser.http, w.replicas[0])
        verifier = secrets.token_urlsafe(48)
        got = await code(w, browser, client_id, verifier, endpoint)
        issued = await browser.http.post(f"{w.replicas[1].url}/oauth/token",
                                         data=exchange(w, client_id, got, verifier))
    assert issued.status_code == 200, issued.text
    tokens = issued.json()
    return Grant(client_id, tokens["access_token"], tokens["refresh_token"])


# -- MCP calls -----------------------------------------------------------------------------------


def echo(text: str, request_id: int = 1) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": text}}})


async def call(http: httpx.AsyncClient, url: str, token: str, text: str,
               request_id: int = 1) -> httpx.Response:
    return await http.post(url, content=echo(text, request_id),
                           headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"})


def answered(response: httpx.Response, text: str) -> bool:
    return response.status_code == 200 and \
        response.json().get("result", {}).get("content", [{}])[0].get("text") == text


def invalid_token(response: httpx.Response) -> bool:
    return response.status_code == 401 and \
        'error="invalid_token"' in response.headers.get("www-authenticate", "")


def invalid_grant(response: httpx.Response) -> bool:
    return response.status_code == 400 and response.json()["error"] == "invalid_grant"


def echoing(text: str) -> Callable[[Served], bool]:
    """Matches the call HAProxy logged whose echo text is `text`."""
    return lambda s: s.rpc_method == "tools/call" and f'"text":"{text}"' in s.body


async def known_everywhere(w: World, http: httpx.AsyncClient, token: str) -> None:
    """Until each replica accepts `token`: one signed with a key another replica minted a
    moment ago is verified once this replica rereads the key table (an unknown key id rereads
    it, at most once a second: docs/deployment.md, "Several replicas")."""
    for replica in w.replicas:
        async def accepted(url: str = replica.endpoint) -> bool:
            return answered(await call(http, url, token, "known"), "known")

        await until(accepted, what=f"{replica.name} to know the key of a fresh token")


async def through_both(w: World, http: httpx.AsyncClient, token: str, text: str,
                       endpoint: str = "up") -> list[tuple[str, httpx.Response]]:
    """Calls through the load balancer until each replica has served one (round robin: two,
    unless something else came between); (replica, response) of each, from HAProxy's log."""
    served: dict[str, httpx.Response] = {}
    pairs: list[tuple[str, httpx.Response]] = []
    # round robin serves both in two calls, unless a replica's check failed a moment ago
    # (the first test after the cluster's start): then until it is back, within a deadline
    end = time.monotonic() + 20
    for k in itertools.count():
        if k >= 6 and time.monotonic() > end:
            break
        response = await call(http, f"{w.public}/mcp/{endpoint}", token, f"{text} {k}",
                              request_id=k)
        logged = await w.cluster.logged(echoing(f"{text} {k}"), f"call {text} {k}")
        pairs.append((logged.server, response))
        served.setdefault(logged.server, response)
        if len(served) == len(w.replicas):
            return pairs
    raise AssertionError(f"HAProxy sent every call to one replica: {[p[0] for p in pairs]}")


# -- 1. revocation -------------------------------------------------------------------------------


async def test_an_access_token_revoked_on_one_replica_is_refused_by_the_other(
        world: World) -> None:
    w = world
    tokens = await grant(w, "alice")
    r0, r1 = w.replicas
    async with httpx.AsyncClient(timeout=10) as http:
        await known_everywhere(w, http, tokens.access_token)
        before = await through_both(w, http, tokens.access_token, "before revoke")
        assert all(answered(r, f"before revoke {k}") for k, (_, r) in enumerate(before)), \
            [r.text for _, r in before]
        revoked = await http.post(f"{r0.url}/oauth/revoke",
                                  data={"token": tokens.access_token,
                                        "client_id": tokens.client_id})
        assert revoked.status_code == 200, revoked.text
        # r1's next call with it, and every call after through the load balancer
        assert invalid_token(await call(http, r1.endpoint, tokens.access_token, "after"))
        after = await through_both(w, http, tokens.access_token, "after revoke")
        assert all(invalid_token(r) for _, r in after), [r.text for _, r in after]
        # the grant's refresh token still works (only the access token was revoked), on r1
        fresh = await http.post(f"{r1.url}/oauth/token", data={
            "grant_type": "refresh_token", "client_id": tokens.client_id,
            "refresh_token": tokens.refresh_token})
        assert fresh.status_code == 200, fresh.text
        assert answered(await call(http, r0.endpoint, fresh.json()["access_token"], "new"),
                        "new")
    assert {name for name, _ in before} == {name for name, _ in after} == {"r0", "r1"}
    forwarded = [c.arguments["text"] for c in w.probe.tool_calls("echo")]
    assert not [t for t in forwarded if t.startswith("after revoke")]  # refused at the edge


async def test_a_refresh_family_revoked_on_one_replica_is_refused_by_the_other(
        world: World) -> None:
    w = world
    tokens = await grant(w, "alice")
    r0, r1 = w.replicas
    async with httpx.AsyncClient(timeout=10) as http:
        # one rotation on r0: the family now has a second access token and refresh token
        step = await http.post(f"{r0.url}/oauth/token", data={
            "grant_type": "refresh_token", "client_id": tokens.client_id,
            "refresh_token": tokens.refresh_token})
        assert step.status_code == 200, step.text
        newer = step.json()
        for token in (tokens.access_token, newer["access_token"]):
            await known_everywhere(w, http, token)
            assert answered(await call(http, r1.endpoint, token, "family"), "family")
        revoked = await http.post(f"{r1.url}/oauth/revoke", data={
            "token": newer["refresh_token"], "token_type_hint": "refresh_token",
            "client_id": tokens.client_id})
        assert revoked.status_code == 200, revoked.text
        # every access token of the family is refused on r0's next call, and through both
        for token in (tokens.access_token, newer["access_token"]):
            assert invalid_token(await call(http, r0.endpoint, token, "family"))
            after = await through_both(w, http, token, f"family {token[-6:]}")
            assert all(invalid_token(r) for _, r in after)
        # and its refresh token at r0
        again = await http.post(f"{r0.url}/oauth/token", data={
            "grant_type": "refresh_token", "client_id": tokens.client_id,
            "refresh_token": newer["refresh_token"]})
        assert invalid_grant(again), again.text


# -- 2. an authorization code, once --------------------------------------------------------------


async def test_one_code_redeemed_at_both_replicas_at_once_succeeds_once(world: World) -> None:
    w = world
    async with person(w, "alice") as browser, httpx.AsyncClient(timeout=10) as http:
        client_id = await register(w, http, w.replicas[1])
        verifier = secrets.token_urlsafe(48)
        got = await code(w, browser, client_id, verifier)
        form = exchange(w, client_id, got, verifier)
        answers = await asyncio.gather(*(http.post(f"{r.url}/oauth/token", data=form)
                                         for r in w.replicas))
        ok = [r for r in answers if r.status_code == 200]
        assert len(ok) == 1 and sum(map(invalid_grant, answers)) == 1, \
            [(r.status_code, r.text) for r in answers]
        # the code was presented twice: what its one use produced is revoked on both
        # replicas (RFC 9700), the access token at the edge and the refresh token
        tokens = ok[0].json()
        for replica in w.replicas:
            assert invalid_token(await call(http, replica.endpoint, tokens["access_token"],
                                            "code"))
            refreshed = await http.post(f"{replica.url}/oauth/token", data={
                "grant_type": "refresh_token", "client_id": client_id,
                "refresh_token": tokens["refresh_token"]})
            assert invalid_grant(refreshed), refreshed.text
        # and a third try at either is refused too
        assert invalid_grant(await http.post(f"{w.replicas[0].url}/oauth/token", data=form))


# -- 3. flows started on one replica, completed on the other -------------------------------------


async def test_a_consent_started_on_one_replica_completes_on_the_other(world: World) -> None:
    w = world
    async with person(w, "alice") as browser:
        client_id = await register(w, browser.http, w.replicas[0])
        verifier = secrets.token_urlsafe(48)
        got = await code(w, browser, client_id, verifier)
        # authorize on r0, the sign-in page from r1, signed in on r0, the consent page (its
        # flow) made on r1 and decided on r0
        assert browser.served == [
            ("r0", "GET", "/oauth/authorize", 303), ("r1", "GET", "/signin", 200),
            ("r0", "POST", "/signin", 303), ("r1", "GET", "/oauth/authorize", 200),
            ("r0", "POST", "/oauth/authorize", 303)]
        issued = await browser.http.post(f"{w.replicas[1].url}/oauth/token",
                                         data=exchange(w, client_id, got, verifier))
    assert issued.status_code == 200, issued.text
    claims = jwt.decode(issued.json()["access_token"], options={"verify_signature": False})
    assert claims["sub"] == "local:alice" and claims["aud"] == w.resource()


async def test_a_federated_sign_in_started_on_one_replica_completes_on_the_other(
        world: World) -> None:
    w = world
    r0, r1 = w.replicas
    async with httpx.AsyncClient(follow_redirects=False, timeout=10) as browser:
        start = await browser.get(f"{r0.url}/signin/oidc", params={"next": "/signin/done"})
        assert start.status_code == 303, start.text
        assert start.headers["location"].startswith(f"{w.idp.base}/authorize?")
        back = (await browser.get(start.headers["location"])).headers["location"]
        assert back.startswith(f"{w.public}/signin/oidc/callback?")
        done = await browser.get(on(r1, back))
        assert done.status_code == 303, done.text
        assert done.headers["location"] == "/signin/done"
        page = await browser.get(f"{r0.url}/signin/done")
        assert "You are signed in as ada." in page.text
        # the flow was taken once: the same callback again, at r0, is refused
        replayed = await browser.get(on(r0, back))
        assert replayed.status_code == 400, replayed.text
    assert w.idp.hits["token"] == 1


async def connect_gh(w: World, browser: Crossing) -> None:
    """Sign in, then the connect flow: started on one replica, its callback on the other."""
    origin = {"Origin": w.public}
    r0, r1 = browser.replicas
    signed = await browser.http.post(f"{r0.url}/signin", headers=origin, data={
        "name": browser.user, "password": browser.password, "next": "/signin/done"})
    assert signed.status_code == 303, signed.text
    start = await browser.http.get(f"{r1.url}/connect/gh", params={"start": "1"})
    assert start.status_code == 303, start.text
    assert start.headers["location"].startswith(f"{w.gh_as.base}/authorize?")
    back = (await browser.http.get(start.headers["location"])).headers["location"]
    assert back.startswith(f"{w.public}/connect/gh/callback?")
    done = await browser.http.get(on(r0, back))
    assert done.status_code == 200 and "connected" in done.text, done.text
    listed = await browser.http.get(f"{r1.url}/api/v1/me/connections")
    assert listed.json()["items"] == [{"upstream": "gh", "status": "connected",
                                       "connect_url": f"{w.public}/connect/gh"}]


async def test_a_connect_flow_started_on_one_replica_completes_on_the_other(
        world: World) -> None:
    w = world
    async with person(w, "alice") as browser:
        await connect_gh(w, browser)
    tokens = await grant(w, "alice", "gh")
    async with httpx.AsyncClient(timeout=10) as http:
        calls = await through_both(w, http, tokens.access_token, "connected", "gh")
    assert all(answered(r, f"connected {k}") for k, (_, r) in enumerate(calls)), \
        [r.text for _, r in calls]
    # each call forwarded with alice's own token at gh, as the connect flow stored it
    assert {bearer(w, f"connected {k}") for k in range(len(calls))} == {
        f"Bearer {upstream_token(w, 'alice')}"}


def upstream_token(w: World, name: str) -> str:
    """`name`'s access token at gh, as the gateway's vault holds it."""
    with Database(w.database_url) as database:
        row = Vault(database, keys_from_env({"TOLLHOUSE_SECRET_KEY": SECRET_KEY})).get(
            "gh", f"tollhouse:local|local:{name}")
    assert row is not None and row.status == "connected"
    return str(row.tokens["access_token"])


def bearer(w: World, text: str) -> str | None:
    """The Authorization header the upstream got with the echo call of `text`."""
    (found,) = [c for c in w.probe.tool_calls("echo") if c.arguments["text"] == text]
    return found.headers.get("authorization")


# -- 4. a signing key rotated by one replica -----------------------------------------------------


def stored_keys(w: World) -> dict[str, float]:
    return {str(kid): float(at) for kid, at in
            db_backends.rows(w.database_url, "SELECT kid, created_at FROM oauth_keys")}


async def jwks(http: httpx.AsyncClient, replica: Replica) -> set[str]:
    response = await http.get(f"{replica.url}/oauth/jwks.json")
    assert response.status_code == 200, response.text
    return {k["kid"] for k in response.json()["keys"]}


def kid(token: str) -> str:
    return str(jwt.get_unverified_header(token)["kid"])


async def test_a_key_rotated_by_one_replica_is_published_and_used_by_both(
        world: World) -> None:
    w = world
    r0, r1 = w.replicas
    tokens = await grant(w, "bob")
    refresh = tokens.refresh_token
    async with httpx.AsyncClient(timeout=10) as http:
        async def at_r0() -> str:
            nonlocal refresh
            step = await http.post(f"{r0.url}/oauth/token", data={
                "grant_type": "refresh_token", "client_id": tokens.client_id,
                "refresh_token": refresh})
            assert step.status_code == 200, step.text
            refresh = step.json()["refresh_token"]
            return str(step.json()["access_token"])

        # tokens issued at r0 only, until one of them made r0 mint a key (it falls due
        # key_rotation_s after the newest; r1 issues nothing meanwhile, so r0 minted it)
        known = stored_keys(w)

        async def minted() -> bool:
            if set(stored_keys(w)) - set(known):
                return True
            await at_r0()
            return False

        await until(minted, ROTATION_S + DEADLINE_S, "r0's minting a key")
        seen = time.monotonic()  # the key is stored (committed) by now
        (new,) = set(stored_keys(w)) - set(known)
        assert new in await jwks(http, r0)  # published by the replica that minted it at once

        # r1 publishes it within its reread interval (key_rotation_s, below 60 s): a JWKS
        # request sent that long after the key was stored lists it
        async def published() -> bool:
            sent = time.monotonic()
            if new in await jwks(http, r1):
                return True
            assert sent < seen + ROTATION_S, "r1's JWKS lacked the key past the bound"
            return False

        await until(published, ROTATION_S + DEADLINE_S, "r1's publishing the key")

        # r0 signs with it once it has been published for key_rotation_s / 2; r1 accepts
        # that token, and signs with it (or a newer key) too
        signed = ""

        async def signs_with_it() -> bool:
            nonlocal signed
            signed = await at_r0()
            return kid(signed) == new

        await until(signs_with_it, ROTATION_S + DEADLINE_S, "r0's signing with the new key")
        assert answered(await call(http, r1.endpoint, signed, "rotated"), "rotated")
        step = await http.post(f"{r1.url}/oauth/token", data={
            "grant_type": "refresh_token", "client_id": tokens.client_id,
            "refresh_token": refresh})
        assert step.status_code == 200, step.text
        keys = stored_keys(w)
        assert keys[kid(step.json()["access_token"])] >= keys[new]
        assert answered(await call(http, r0.endpoint, step.json()["access_token"], "r1's"),
                        "r1's")


# -- 5. a person's upstream token, refreshed once ------------------------------------------------


@contextlib.asynccontextmanager
async def lease_attempts(redis: Redis, prefix: str) -> AsyncIterator[list[str]]:
    """Every SET of a lease under `prefix` that Redis executes meanwhile (MONITOR), by client
    port: the holder's, then those of processes that found it taken."""
    seen: list[str] = []
    async with redis.monitor() as monitor:
        async def read() -> None:
            while True:
                try:
                    info = await monitor.next_command()
                except (AttributeError, ValueError):  # another client's line it cannot parse
                    continue
                if info["command"].startswith(f"SET {prefix}"):
                    seen.append(info["client_port"])

        reader = asyncio.create_task(read())
        try:
            yield seen
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def test_concurrent_calls_on_both_replicas_refresh_the_upstream_token_once(
        world: World) -> None:
    w = world
    w.gh_as.expires_in = 1  # the token the connect flow stores is due for refresh at once
    try:
        async with person(w, "bob", start=1) as browser:
            await connect_gh(w, browser)
    finally:
        w.gh_as.expires_in = 3600
    connected = upstream_token(w, "bob")
    tokens = await grant(w, "bob", "gh")
    w.gh_as.hold_refresh = hold = asyncio.Event()
    before = len(w.gh_as.refreshed)
    try:
        async with httpx.AsyncClient(timeout=30) as http, \
                lease_attempts(w.cluster.redis, f"{w.cluster.prefix}ls:rf:gh:") as attempts:
            def bob(k: int) -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(call(http, f"{w.public}/mcp/gh",
                                                tokens.access_token, f"bob {k}", request_id=k))

            first = bob(0)
            await until(lambda: len(w.gh_as.refreshed) > before,
                        what="the first refresh to reach the authorization server")
            rest = [bob(k) for k in range(1, 5)]  # round robin: on both replicas
            # the other replica found the lease taken (or, were it not shared, sent its
            # own refresh, which the count below refuses)
            await until(lambda: len(attempts) >= 2 or len(w.gh_as.refreshed) > before + 1,
                        what="the other replica waiting on the refresh")
            hold.set()
            answers = await asyncio.gather(first, *rest)
    finally:
        w.gh_as.hold_refresh = None
        hold.set()
    assert [answered(r, f"bob {k}") for k, r in enumerate(answers)] == [True] * 5, \
        [r.text for r in answers]
    assert len(w.gh_as.refreshed) == before + 1  # exactly one refresh at the upstream's AS
    fresh = upstream_token(w, "bob")
    assert fresh != connected
    assert {bearer(w, f"bob {k}") for k in range(5)} == {f"Bearer {fresh}"}
    # HAProxy sent the calls to both replicas; the lease was taken by one, refused to another
    served = [await w.cluster.logged(echoing(f"bob {k}"), f"call bob {k}") for k in range(5)]
    assert {s.server for s in served} == {"r0", "r1"}
    assert len(attempts) >= 2
