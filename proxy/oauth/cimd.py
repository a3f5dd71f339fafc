"""Client ID Metadata Documents: a client whose `client_id` is an https URL describes itself in
the JSON document at that URL. The document is fetched through the egress guard (every address
the host resolves to must be in the `remote` zone and no cloud metadata address; the connection
goes to exactly those addresses), capped at 64 KiB, checked, and cached for an hour. A
failure is cached for a minute, and concurrent requests for one URL share one fetch, so a
client_id cannot be used to make the gateway fetch the same URL over and over."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import httpx
import orjson
from cachetools import TTLCache

from proxy.destinations import Refused, Resolver
from proxy.oauth.server import Client, OAuthError, valid_redirect_uri
from proxy.singleflight import SingleFlight
from proxy.upstream.fetch import GuardedFetch

LIMIT = 65536
FAILURE_TTL_S = 60.0


class MetadataDocuments:
    def __init__(self, resolver: Resolver | None = None, zones: tuple[str, ...] = ("remote",),
                 clock: Callable[[], float] = time.monotonic,
                 failure_ttl_s: float = FAILURE_TTL_S) -> None:
        self._fetcher = GuardedFetch(resolver)
        self._zones = zones
        self._cache: TTLCache[str, Client] = TTLCache(maxsize=10_000, ttl=3600, timer=clock)
        # (error, description, status) of a recent failure: answered again without fetching
        self._failures: TTLCache[str, tuple[str, str, int]] = TTLCache(
            maxsize=10_000, ttl=failure_ttl_s, timer=clock)
        # concurrent asks for one URL share one fetch, which none of them cancels by leaving
        self._fetching: SingleFlight[str, Client] = SingleFlight(detached=True)

    @staticmethod
    def applies(client_id: str) -> bool:
        return client_id.startswith("https://")

    async def client(self, client_id: str) -> Client:
        cached = self._cache.get(client_id)
        if cached is not None:
            return cached
        failed = self._failures.get(client_id)
        if failed is not None:
            raise OAuthError(*failed)
        return await self._fetching.run(client_id, lambda: self._fetch_once(client_id))

    async def _fetch_once(self, client_id: str) -> Client:
        try:
            client = await self._fetch(client_id)
        except OAuthError as exc:
            self._failures[client_id] = (exc.error, exc.wire_message, exc.status)
            raise
        self._cache[client_id] = client
        return client

    async def _fetch(self, client_id: str) -> Client:
        parts = urlsplit(client_id)
        host = parts.hostname
        if not host or parts.fragment or parts.username or parts.password:
            raise OAuthError("invalid_client", "client_id is not a usable https URL")
        addresses = await self._admit(host, parts.port or 443)
        try:
            async with self._fetcher.stream("GET", client_id, addresses, timeout=5.0,
                                            headers={"accept": "application/json"}) as response:
                if response.status_code != 200:
                    raise OAuthError("invalid_client", "the client metadata document "
                                     f"answered HTTP {response.status_code}")
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > LIMIT:
                        raise OAuthError("invalid_client",
                                         "the client metadata document is too large")
        except httpx.HTTPError:
            raise OAuthError("invalid_client",
                             "the client metadata document could not be fetched") from None
        return self._parse(client_id, body)

    async def _admit(self, host: str, port: int) -> Sequence[str]:
        """A document is the client's choice: never a metadata address, only `self._zones`."""
        try:
            return await self._fetcher.admit(host, port, self._zones)
        except Refused:
            raise OAuthError("invalid_client", "the client metadata document is not "
                             "reachable under the egress policy") from None
        except OSError:
            raise OAuthError("invalid_client", "the client_id host does not resolve") from None

    @staticmethod
    def _parse(client_id: str, body: bytes) -> Client:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise OAuthError("invalid_client", "the client metadata document is not JSON") \
                from None
        if not isinstance(doc, dict) or doc.get("client_id") != client_id:
            raise OAuthError("invalid_client", "the document's client_id is not its own URL")
        uris = doc.get("redirect_uris")
        if not isinstance(uris, list) or not uris or not all(
                isinstance(u, str) and valid_redirect_uri(u) for u in uris):
            raise OAuthError("invalid_client", "the document's redirect_uris are missing or "
                             "not usable redirect URIs")
        if doc.get("token_endpoint_auth_method", "none") != "none":
            raise OAuthError("invalid_client", "a metadata-document client authenticates with "
                             "none (PKCE)")
        name = doc.get("client_name")
        return Client(client_id, name[:200] if isinstance(name, str) and name else client_id,
                      tuple(uris), "none")

    async def aclose(self) -> None:
        await self._fetcher.aclose()
