"""A NUL in a path, query, form or JSON string is refused with a 400 in the route's own shape
on every Quart route (PostgreSQL's text cannot hold one: it used to be a 500 there), and the
same on SQLite."""

from __future__ import annotations

import pytest

from proxy.people.accounts import Accounts
from tests import db_backends
from tests.stack import gateway_stack

CHALLENGE = "a" * 43


@pytest.mark.parametrize("method,path,kwargs,where", [
    ("POST", "/signin", {"data": {"name": "ro\x00ot", "password": "root-password"}}, "body"),
    ("POST", "/oauth/register", {"json": {"redirect_uris": ["http://127.0.0.1/cb"],
                                          "client_name": "a\x00b"}}, "body"),
    ("POST", "/oauth/token", {"data": {"grant_type": "refresh_token",
                                       "refresh_token": "r\x00", "client_id": "c"}}, "body"),
    ("GET", "/oauth/authorize", {"params": {"client_id": "c\x00", "response_type": "code",
                                            "redirect_uri": "http://127.0.0.1/cb",
                                            "code_challenge": CHALLENGE,
                                            "code_challenge_method": "S256"}}, "query"),
    ("POST", "/oauth/revoke", {"data": {"token": "t\x00", "client_id": "c"}}, "body"),
    ("GET", "/connect/a%00b", {}, "path"),
])
async def test_a_nul_is_a_400_in_the_routes_shape(method: str, path: str, kwargs: dict,
                                                  where: str) -> None:
    database = db_backends.open_database()
    Accounts(database).create_local("root", "root-password")
    async with gateway_stack(lambda urls: {
            "server": {"public_url": urls.gateway}, "auth": {"mode": "jwt"},
            "oauth_server": {"enabled": True}, "database": {"url": database.url},
            "upstreams": [{"name": "e", "url": "http://127.0.0.1:9/mcp"}]},
            secret_key="k", client={"follow_redirects": False}) as site:
        url, client = site.url, site.client
        client.headers["Origin"] = url
        refused = await client.request(method, f"{url}{path}", **kwargs)
        assert refused.status_code == 400, refused.text
        assert refused.json() == {"error": "invalid_request", "error_description":
                                  f"the request's {where} holds a NUL character"}
        # the same request without the NUL is served (a sign-in, say), and the app is well
        signed = await client.post(f"{url}/signin", data={"name": "root",
                                                          "password": "root-password"})
        assert signed.status_code == 303
        escaped = await client.post(f"{url}/oauth/register", json={
            "redirect_uris": ["http://127.0.0.1/cb"], "client_name": "a\\u0000 is text"})
        assert escaped.status_code == 201 and escaped.json()["client_name"] == "a\\u0000 is text"
