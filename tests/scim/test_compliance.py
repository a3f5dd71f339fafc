"""`scim2-tester`, the SCIM compliance checker, against a real gateway (Hypercorn on a loopback
port, the test's database): every check it runs either passes or is one of the known
deviations listed in docs/provisioning.md with its reason (`KNOWN`); a new failure fails."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from scim2_client.client import BaseSyncSCIMClient
from scim2_tester import Status, check_server

from tests.stack import gateway_stack

TOKEN = "scim-" + "k" * 40

# the checks that do not pass, by title, each explained in docs/provisioning.md
KNOWN: dict[str, str] = {}


class HttpxEngine(BaseSyncSCIMClient):
    """scim2-client's synchronous client over an httpx.Client (its own engine is httpx2's)."""

    def __init__(self, client: httpx.Client, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client

    def _stays_under_base_url(self, endpoint: str) -> bool:
        url = self.client.build_request("GET", endpoint).url
        base = self.client.base_url
        return (url.scheme, url.netloc) == (base.scheme, base.netloc) and \
            url.raw_path.startswith(base.raw_path)

    def _parse_json(self, response: Any) -> Any:
        return response.json()

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        return self.client.request(method, url, **kwargs)


def _check(base_url: str) -> list[Any]:
    with httpx.Client(base_url=base_url + "/scim/v2",
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
        return check_server(HttpxEngine(http))


async def test_scim2_tester_finds_only_the_known_deviations() -> None:
    config = {"scim": {"enabled": True, "token": TOKEN}}
    async with gateway_stack(lambda urls: {**config, "server": {"public_url": urls.gateway}},
                             secret_key="k" * 32) as site:
        results = await asyncio.to_thread(_check, site.url)
    failed = {r.title: r.reason for r in results
              if r.status in (Status.ERROR, Status.CRITICAL)}
    passed = [r for r in results if r.status not in (Status.ERROR, Status.CRITICAL)]
    assert len(passed) > 20, [(r.title, r.status) for r in results]
    assert set(failed) <= set(KNOWN), failed
