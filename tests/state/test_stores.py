"""`[state]`, the one place stores are built, and StoreUnavailable's answer on each surface."""

from __future__ import annotations

import orjson
import pytest
from quart import Quart

from proxy import web as edge
from proxy.config import ConfigError, from_dict
from proxy.errors import StoreUnavailable, render
from proxy.state import open_stores
from proxy.state.browser import MemoryBrowserSessions
from proxy.state.lockouts import MemoryLockoutStore
from proxy.state.ratelimit import Limit

UPSTREAMS = {"upstreams": [{"name": "e", "url": "http://127.0.0.1:9/mcp"}]}


def test_state_is_in_memory_by_default() -> None:
    cfg = from_dict(UPSTREAMS)
    assert cfg.state.url == "memory"
    assert from_dict({**UPSTREAMS, "state": {"url": "memory"}}).state.url == "memory"


@pytest.mark.parametrize("url", ["memcached://:hunter2@cache.internal:11211", "memroy", "",
                                 "redis:/cache.internal", "http://:hunter2@cache.internal/"])
def test_any_other_store_is_one_config_line_that_shows_no_secret(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict({**UPSTREAMS, "state": {"url": url}})
    message = str(info.value)
    assert message.startswith("config: 'state.url' must be \"memory\"")
    assert "\n" not in message and "hunter2" not in message and "cache.internal" not in message


@pytest.mark.parametrize("url", ["redis://:hunter2@cache.internal:6379/0",
                                 "rediss://cache.internal:6380", "redis://127.0.0.1:6379/15"])
def test_redis_is_a_state_store(url: str) -> None:
    cfg = from_dict({**UPSTREAMS, "state": {"url": url}})
    assert cfg.state.shared and cfg.state.key_prefix == "tollhouse:"


@pytest.mark.parametrize(("state", "message"), [
    ({"url": "redis://:hunter2@cache.internal:notaport/0"}, "port is not a number"),
    ({"url": "redis://:hunter2@/0"}, "must name a host"),
    ({"url": "redis://:hunter2@cache.internal/zero"}, "database number"),
    ({"url": "redis://h", "key_prefix": ""}, "'state.key_prefix' must be"),
    ({"url": "redis://h", "key_prefix": "a b"}, "'state.key_prefix' must be"),
    ({"url": "redis://h", "timeout_s": 0}, "'state.timeout_s' must be"),
])
def test_a_bad_redis_setting_is_one_line_without_the_secret(state: dict[str, object],
                                                             message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        from_dict({**UPSTREAMS, "state": state})
    assert "\n" not in str(info.value) and "hunter2" not in str(info.value)


def test_workers_need_a_shared_store() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict({**UPSTREAMS, "server": {"workers": 4}})
    assert "'server.workers'" in str(info.value) and "'state.url'" in str(info.value)
    assert "\n" not in str(info.value)
    cfg = from_dict({**UPSTREAMS, "server": {"workers": 4},
                     "state": {"url": "redis://127.0.0.1:6379/0"}})
    assert cfg.server.workers == 4
    with pytest.raises(ConfigError, match="'server.workers' must be between 1 and 64"):
        from_dict({**UPSTREAMS, "server": {"workers": 0}})


def test_unknown_state_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown key 'state.uri'"):
        from_dict({**UPSTREAMS, "state": {"uri": "memory"}})


async def test_open_stores_builds_every_store_on_the_clock_given() -> None:
    now = [0.0]
    cfg = from_dict({**UPSTREAMS, "auth": {"mode": "jwt", "lockout": {"max_failures": 1,
                                                                       "lockout_s": 30}},
                     "oauth_server": {"enabled": True, "browser_session_ttl_s": 50}})
    stores = open_stores(cfg, lambda: now[0])
    assert isinstance(stores.lockouts, MemoryLockoutStore)
    assert isinstance(stores.browser_sessions, MemoryBrowserSessions)
    await stores.lockouts.attempt(["ip:a"], failed=True)  # the config's limits
    assert await stores.lockouts.locked(["ip:a"]) == 30
    sid = await stores.browser_sessions.create("u")
    now[0] = 50.0
    assert await stores.browser_sessions.user_id(sid) is None
    one_a_minute = Limit("rl:r:a", 60_000_000, 0)
    assert await stores.rate_limits.take([one_a_minute]) is None
    assert await stores.rate_limits.take([one_a_minute]) is not None
    now[0] = 110.0  # the rate-limit store runs on the same clock
    assert await stores.rate_limits.take([one_a_minute]) is None
    flows = [stores.signin_flows, stores.connect_flows, stores.consent_flows]
    assert len({id(f) for f in flows}) == 3  # one store each: a flood of one keeps the others
    await stores.signin_flows.put("k", "b", {})
    assert await stores.consent_flows.take("k", "b") is None


@pytest.mark.parametrize("request_id", [None, 7, "a"])
def test_store_unavailable_on_the_mcp_edge(request_id: object) -> None:
    status, headers, body = render(StoreUnavailable("rate-limit store: timeout"), request_id)
    assert status == 503 and headers["Retry-After"] == "1"
    assert orjson.loads(body) == {"jsonrpc": "2.0", "id": request_id, "error": {
        "code": -32000, "message": "Resident runtime unavailable"}}  # the detail stays inside
    assert StoreUnavailable(retry_after_s=2.5).headers["Retry-After"] == "3"


async def test_store_unavailable_on_api_and_oauth_routes() -> None:
    app = Quart("t")
    edge.register(app)

    @app.route("/api/v1/thing")
    async def thing() -> None:
        raise StoreUnavailable("the browser-session store is unavailable")

    @app.route("/oauth/token", methods=["POST"])
    async def token() -> None:
        raise StoreUnavailable("the code store is unavailable")

    client = app.test_client()
    api = await client.get("/api/v1/thing")
    assert api.status_code == 503 and api.headers["Retry-After"] == "1"
    assert orjson.loads(await api.get_data()) == {
        "detail": "the browser-session store is unavailable"}
    oauth = await client.post("/oauth/token")
    assert oauth.status_code == 503 and oauth.headers["Retry-After"] == "1"
    assert orjson.loads(await oauth.get_data()) == {
        "error": "temporarily_unavailable", "error_description": "the code store is unavailable"}
