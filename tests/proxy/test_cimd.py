"""Client ID Metadata Documents: fetched only through the egress guard, and checked."""

from __future__ import annotations

import orjson
import pytest

from proxy.oauth.cimd import MetadataDocuments
from proxy.oauth.server import OAuthError

URL = "https://client.example/oauth/client.json"


class Resolver:
    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)

    async def resolve(self, host: str, port: int) -> list[str]:
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
