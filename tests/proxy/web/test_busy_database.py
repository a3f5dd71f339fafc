"""A database held by another writer past database.busy_timeout_s: the routes outside /mcp
answer 503 with Retry-After in their own shape (was a 500), and work again once it is free."""

from __future__ import annotations

from proxy.people.accounts import Accounts
from tests import db_backends
from tests.helpers import until
from tests.stack import gateway_stack

CLIENT = {"redirect_uris": ["http://127.0.0.1/cb"], "token_endpoint_auth_method": "none"}


async def test_a_held_database_is_a_503_then_served_again() -> None:
    database = db_backends.open_database()
    Accounts(database).create_local("root", "root-password")
    async with gateway_stack(lambda urls: {
            "server": {"public_url": urls.gateway}, "auth": {"mode": "jwt"},
            "oauth_server": {"enabled": True},
            "database": {"url": database.url, "busy_timeout_s": 0.3},
            "upstreams": [{"name": "e", "url": "http://127.0.0.1:9/mcp"}]},
            secret_key="k", client={"follow_redirects": False}) as site:
        url, client = site.url, site.client
        client.headers["Origin"] = url

        async def ready() -> bool:  # start-up reads users (its mirrors): done before the hold
            return (await client.get(f"{url}/readyz")).status_code == 200

        await until(ready, what="the gateway's start-up")
        with db_backends.tables_held(database.url, "users", "oauth_clients"):
            busy = [await client.post(f"{url}/oauth/register", json=CLIENT)]
            if database.postgresql:  # (SQLite in WAL mode lets readers through)
                busy.append(await client.post(f"{url}/signin", data={
                    "name": "root", "password": "root-password"}))
        for response in busy:
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"] == "1"
            assert response.json() == {"error": "temporarily_unavailable",
                                       "error_description": "the database is busy; retry"}
        assert (await client.post(f"{url}/oauth/register", json=CLIENT)).status_code == 201
        signed = await client.post(f"{url}/signin", data={"name": "root",
                                                          "password": "root-password"})
        assert signed.status_code == 303
