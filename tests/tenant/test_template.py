"""The URL template of a per-caller upstream: refused at load when a placeholder could reach
the scheme, the userinfo, the query or the fragment (exit 2, one line), and each caller's
value constrained and encoded for where it lands. And the bound on resolved upstreams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.auth.principal import Principal
from proxy.config.template import Missing, UrlTemplate
from proxy.destinations import Destinations, EgressDestinationDenied
from proxy.runtime.cli import main
from proxy.upstream.client import UpstreamRoute
from proxy.upstream.tenants import NoUpstreamForCaller, Tenants
from tests.builders import principal
from tests.helpers import jwt_auth

TENANT = {"tenant": ("tenant", "", "[a-z0-9-]{1,63}")}


def _toml(url: str, placeholders: str = 'tenant = { claim = "tenant" }') -> str:
    return ('[auth]\nmode = "jwt"\n[[auth.issuers]]\nissuer = "https://idp.test/"\n'
            'hs256_secret = "a-test-hs256-secret-of-at-least-32-bytes"\n'
            'algorithms = ["HS256"]\n'
            f'[[upstreams]]\nname = "w"\nurl = "{url}"\n[upstreams.placeholders]\n'
            f'{placeholders}\n')


@pytest.mark.parametrize(("url", "placeholders", "message"), [
    ("{tenant}://x.test/mcp", None, "may not stand in the scheme"),
    ("https://{tenant}@x.test/mcp", None, "may not stand in the userinfo"),
    ("https://u:{tenant}@x.test/mcp", None, "may not stand in the userinfo"),
    ("https://x.test/mcp?t={tenant}", None, "only in the host, port or path"),
    ("https://x.test/mcp#{tenant}", None, "only in the host, port or path"),
    ("https://x.test:8{tenant}/mcp", None, "must be the whole port"),
    ("https://[::{tenant}]/mcp", None, "may not stand in an IPv6 address"),
    ("https://{tenant}.x.test/{other}", None, "does not declare"),
    ("https://x.test/mcp", None, "has no {placeholder}"),
    ("https://{subject}.x.test/mcp", None, "which the URL does not use"),
    ("https://{tenant}.x.test/mcp", 'tenant = { pattern = "[a-z" }', "not a regular expression"),
    ("https://{tenant}_x.test/mcp", None, "may hold only letters, digits"),
    ("https://{tenant.x.test/mcp", None, "unmatched"),
])
def test_a_bad_template_stops_start_up(tmp_path: Path, capsys: Any, url: str,
                                       placeholders: str | None, message: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(_toml(url, *(() if placeholders is None else (placeholders,))))
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "'upstreams[0].url'" in err and message in err and err.count("\n") == 1


@pytest.mark.parametrize(("url", "values", "want"), [
    ("https://{tenant}.x.test/mcp", {"tenant": "acme"}, "https://acme.x.test/mcp"),
    ("https://x.test/t/{tenant}/mcp", {"tenant": "a-1"}, "https://x.test/t/a-1/mcp"),
    ("http://x.test:{port}/mcp", {"port": "08080"}, "http://x.test:8080/mcp"),
    ("https://x.test/u/{subject}", {"subject": "bob"}, "https://x.test/u/bob"),
])
def test_values_land_encoded(url: str, values: dict[str, str], want: str) -> None:
    declared = {n: (n, "", "[a-z0-9-]{1,63}" if n != "port" else "[0-9]+") for n in values
                if n != "subject"}
    assert UrlTemplate.parse(url, declared).fill(values) == want


@pytest.mark.parametrize(("url", "pattern", "value"), [
    # a permissive pattern still cannot move the host, the port or the path
    ("https://{tenant}.x.test/mcp", ".+", "evil.example/"),
    ("https://{tenant}.x.test/mcp", ".+", "a@b"),
    ("https://{tenant}.x.test/mcp", ".+", "a:99"),
    ("https://{tenant}.x.test/mcp", ".+", "\u0430cme"),  # not ASCII
    ("https://{tenant}.x.test/mcp", r"\w+", "\u0430cme"),  # \w is ASCII-only here
    ("https://x.test/t/{tenant}", ".+", ".."),
    ("https://x.test/t/{tenant}", ".+", "."),
    ("http://x.test:{tenant}/mcp", ".+", "65536"),
    ("http://x.test:{tenant}/mcp", ".+", "0"),
    ("http://x.test:{tenant}/mcp", ".+", "80/evil"),
])
def test_escapes_fill_nothing(url: str, pattern: str, value: str) -> None:
    template = UrlTemplate.parse(url, {"tenant": ("tenant", "", pattern)})
    assert template.fill({"tenant": value}) == Missing("tenant", "invalid")


def test_a_permissive_path_value_is_percent_encoded_whole() -> None:
    template = UrlTemplate.parse("https://x.test/t/{tenant}/mcp",
                                 {"tenant": ("tenant", "", ".+")})
    assert template.fill({"tenant": "../a/%2F?#"}) == "https://x.test/t/..%2Fa%2F%252F%3F%23/mcp"


class _Dns:
    async def resolve(self, host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host != "lan.x.test" else ["10.0.0.1"]


class _Pool:
    def __init__(self) -> None:
        self.closed = False
        self.open_responses = 0

    async def aclose(self) -> None:
        self.closed = True


def _route(max_resolved: int = 2) -> UpstreamRoute:
    from proxy.config import from_dict

    cfg = from_dict({"auth": jwt_auth(), "upstreams": [{
        "name": "w", "url": "http://{tenant}.x.test/mcp", "zones": ["loopback"],
        "max_resolved": max_resolved, "placeholders": {"tenant": {}}}]}, env={})
    return UpstreamRoute.from_config(cfg.upstreams[0])


async def test_resolved_upstreams_are_bounded_and_the_least_recent_pool_closed() -> None:
    destinations = Destinations((), _Dns())
    pools: list[_Pool] = []
    spawned: list[Any] = []

    def pool() -> Any:
        pools.append(_Pool())
        return pools[-1]

    tenants = Tenants(destinations, pool, spawned.append)
    route = _route()

    def caller(tenant: str) -> Principal:
        return principal("s", claims=(("tenant", tenant),))

    a = await tenants.resolve(route, caller("a"))
    assert a.origin == "http://a.x.test" and a.state_key == "w http://a.x.test/mcp"
    assert await destinations.check(a.dial_key) == ["127.0.0.1"]
    await tenants.resolve(route, caller("b"))
    assert await tenants.resolve(route, caller("a")) is a  # a is the most recent now
    pools[0].open_responses = 1  # a response still holds a connection of a's pool
    await tenants.resolve(route, caller("c"))  # b is dropped: its pool closed
    assert tenants.resolved_count() == 2
    for coro in spawned:
        await coro
    assert [p.closed for p in pools] == [False, True, False]
    with pytest.raises(EgressDestinationDenied):  # b's egress entry is gone with it
        await destinations.check("w http://b.x.test/mcp")
    lan = await tenants.resolve(route, caller("lan"))
    with pytest.raises(EgressDestinationDenied):
        await destinations.check(lan.dial_key)
    with pytest.raises(NoUpstreamForCaller):
        await tenants.resolve(route, principal("s"))
    await tenants.aclose()


async def test_a_reloaded_route_starts_afresh_and_closes_the_old_pools() -> None:
    pools: list[_Pool] = []
    spawned: list[Any] = []

    def pool() -> Any:
        pools.append(_Pool())
        return pools[-1]

    tenants = Tenants(Destinations((), _Dns()), pool, spawned.append)
    caller = principal("s", claims=(("tenant", "a"),))
    before = await tenants.resolve(_route(), caller)
    after = await tenants.resolve(_route(), caller)  # a reload built the route again
    assert after is not before and tenants.resolved_count() == 1
    for coro in spawned:
        await coro
    assert [p.closed for p in pools] == [True, False]
    await tenants.aclose()
    assert pools[1].closed
