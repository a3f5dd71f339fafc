"""Client ID Metadata Documents: fetched only through the egress guard, and checked."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from proxy.oauth.cimd import MetadataDocuments
from proxy.oauth.server import OAuthError
from tests.helpers import Clock

URL = "https://client.example/oauth/client.json"


class Resolver:
    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.calls = 0
        self.entered = asyncio.Event()
        self.release: asyncio.Event | None = None  # when set: each lookup waits for it

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls += 1
        self.entered.set()
        if self.release is not None:
            await self.release.wait()
        return self.addresses


@pytest.mark.parametrize("addresses", [("127.0.0.1",), ("10.0.0.8",), ("169.254.169.254",),
                                       ("93.184.216.34", "127.0.0.1")],
                         ids=["loopback", "lan", "metadata", "rebinding mix"])
async def test_documents_outside_the_remote_zone_are_never_fetched(addresses: tuple[str, ...]
                                                                   ) -> None:
    docs = MetadataDocuments(Resolver(*addresses))
    with pytest.raises(OAuthError) as info:
        await docs.client(URL)
    assert info.value.error == "invalid_client"
    assert "egress policy" in info.value.wire_message


async def test_literal_addresses_are_checked_too() -> None:
    with pytest.raises(OAuthError, match="egress policy"):
        await MetadataDocuments(Resolver()).client("https://127.0.0.1:8443/c.json")


@pytest.mark.parametrize(
    ("doc", "message"),
    [({"client_id": "https://elsewhere/c.json", "redirect_uris": ["https://a/cb"]},
      "not its own URL"),
     ({"client_id": URL}, "redirect_uris"),
     ({"client_id": URL, "redirect_uris": ["http://evil.example/cb"]}, "redirect_uris"),
     ({"client_id": URL, "redirect_uris": ["http://evil.example\\@127.0.0.1/cb"]},
      "redirect_uris"),
     ({"client_id": URL, "redirect_uris": ["https://trusted.example@evil.example/cb"]},
      "redirect_uris"),
     ({"client_id": URL, "redirect_uris": ["https://a.example/cb\r\nX-A: b"]},
      "redirect_uris"),
     ({"client_id": URL, "redirect_uris": ["https://a/cb"],
       "token_endpoint_auth_method": "client_secret_post"}, "authenticates with none")],
)
def test_document_checks(doc: dict, message: str) -> None:
    with pytest.raises(OAuthError, match=message):
        MetadataDocuments._parse(URL, orjson.dumps(doc))


def test_a_good_document() -> None:
    client = MetadataDocuments._parse(URL, orjson.dumps(
        {"client_id": URL, "client_name": "Editor", "redirect_uris": ["http://127.0.0.1:3/cb"]}))
    assert (client.client_id, client.name, client.redirect_uris, client.auth_method) == (
        URL, "Editor", ("http://127.0.0.1:3/cb",), "none")


async def test_a_failure_is_cached_for_a_minute() -> None:
    resolver, clock = Resolver("127.0.0.1"), Clock()
    docs = MetadataDocuments(resolver, clock=clock)
    for _ in range(3):
        with pytest.raises(OAuthError, match="egress policy") as info:
            await docs.client(URL)
        assert info.value.error == "invalid_client" and info.value.status == 400
    assert resolver.calls == 1
    clock.advance(61)
    with pytest.raises(OAuthError, match="egress policy"):
        await docs.client(URL)
    assert resolver.calls == 2


async def test_concurrent_requests_for_one_url_share_one_fetch() -> None:
    resolver = Resolver("127.0.0.1")
    resolver.release = asyncio.Event()
    docs = MetadataDocuments(resolver)
    callers = [asyncio.create_task(docs.client(URL)) for _ in range(10)]
    await asyncio.wait_for(resolver.entered.wait(), 5)
    callers[0].cancel()  # one caller going away does not cancel the others' fetch
    resolver.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert all(isinstance(r, OAuthError) and "egress policy" in r.wire_message
               for r in results[1:])
    assert resolver.calls == 1
