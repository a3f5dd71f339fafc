"""What a reload applies and what it keeps (proxy.runtime.reload): on plain configs, and on a served
app whose file changes; the signal itself, on a real process, is tests/proxy/runtime/test_signals.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.auth import keys as api_keys
from proxy.config import Config, from_dict, load
from proxy.demo import demo_app
from proxy.runtime.reload import applied, fixed_changes
from tests import db_backends
from tests.api.test_registry_shared import answer
from tests.conftest import MCP_HEADERS
from tests.stack import Urls, gateway_stack

PER_USER = {"name": "gh", "url": "http://gh.test/mcp", "auth": "per_user",
            "oauth": {"discover": True}}


def _cfg(**tables: Any) -> Config:
    base: dict[str, Any] = {
        "auth": {"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "s" * 32,
                                              "algorithms": ["HS256"]}]},
        "upstreams": [{"name": "up", "url": "http://up.test/mcp"}, PER_USER]}
    return from_dict({**base, **tables}, env={})


def test_nothing_fixed_changed_when_only_live_tables_did() -> None:
    running = _cfg()
    read = _cfg(rate_limits=[{"name": "r", "rate": "1/s"}],
                upstreams=[{"name": "up", "url": "http://elsewhere.test/mcp",
                            "access": {"tools_deny": ["x"]}}, PER_USER],
                metering={"hook": "m:h"})
    assert fixed_changes(running, read) == []
    assert applied(running, read).upstreams[0].access.tools_deny == ["x"]


def test_each_fixed_key_is_named_and_keeps_its_running_value() -> None:
    running = _cfg()
    read = _cfg(server={"listen": "127.0.0.1:9999", "workers": 1, "shutdown_grace_s": 3},
                database={"url": "sqlite:///other.db"},
                state={"url": "redis://127.0.0.1:6379/1"},
                egress={"metadata_addresses": ["169.254.169.254"]})
    assert fixed_changes(running, read) == [
        "server.listen", "server.shutdown_grace_s", "database.url", "state.url",
        "egress.metadata_addresses"]
    kept = applied(running, read)
    assert kept.server == running.server and kept.database == running.database
    assert kept.state == running.state and kept.egress == running.egress


def test_observability_is_kept_as_it_runs() -> None:
    running = _cfg()
    read = _cfg(observability={"otlp_endpoint": "http://collector.test:4318",
                               "service_name": "edge", "log_format": "json"})
    assert fixed_changes(running, read) == [
        "observability.otlp_endpoint", "observability.service_name",
        "observability.log_format"]
    assert applied(running, read).observability == running.observability


def test_a_per_user_upstream_is_kept_as_it_runs() -> None:
    running = _cfg()
    changed = {**PER_USER, "oauth": {"discover": True, "scopes": ["repo"]}}
    read = _cfg(upstreams=[{"name": "up", "url": "http://up.test/mcp"}, changed,
                           {**PER_USER, "name": "jira"}])
    assert fixed_changes(running, read) == ["upstreams.gh (per_user)",
                                            "upstreams.jira (per_user)"]
    assert [u.name for u in applied(running, read).upstreams] == ["up", "gh"]
    assert applied(running, read).upstream("gh") == running.upstream("gh")
    gone = _cfg(upstreams=[{"name": "up", "url": "http://up.test/mcp"}])
    assert fixed_changes(running, gone) == ["upstreams.gh (per_user)"]
    assert applied(running, gone).upstream("gh") == running.upstream("gh")


def test_a_secret_that_changed_is_named_never_shown() -> None:
    running = _cfg()
    read = _cfg(auth={"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "t" * 32,
                                                   "algorithms": ["HS256"]}]})
    assert fixed_changes(running, read) == ["auth.issuers"]


def _file(database: str, upstream: str, extra: str = "") -> str:
    return (f'[auth]\nmode = "jwt"\n[database]\nurl = "{database}"\n'
            f'[[upstreams]]\nname = "file"\nurl = "{upstream}/mcp"\nzones = ["loopback"]\n'
            + extra)


async def test_a_reload_leaves_the_servers_stored_through_the_api_as_they_are(
        tmp_path: Path) -> None:
    """The file's servers change (one denied a tool, one added, then removed); a server
    created through /api/v1, with its own access rules, is served as it was throughout."""
    database = db_backends.url()
    _, secret = api_keys.create(database, "ops", [], role="admin")
    path = tmp_path / "c.toml"

    def config(urls: Urls) -> Config:
        path.write_text(_file(database, urls.upstream))
        return load(path, env={})

    async with gateway_stack(config, upstream=demo_app(), base_dir=tmp_path, client={
            "headers": {"Authorization": f"Bearer {secret}"}}) as site:
        url, upstream, admin = site.url, site.upstream, site.client

        async def call(endpoint: str, tool: str = "echo") -> httpx.Response:
            arguments = {"text": "hi"} if tool == "echo" else {"a": 1, "b": 2}
            return await admin.post(f"{url}/mcp/{endpoint}", headers=MCP_HEADERS,
                                    content=orjson.dumps({
                                        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                        "params": {"name": tool, "arguments": arguments}}))

        def refused(response: httpx.Response) -> bool:
            return response.status_code == 400 and answer(response)["error"]["code"] == -32602

        stored = {"name": "stored", "url": f"{upstream}/mcp", "zones": ["loopback"],
                  "access": {"tools_deny": ["add"]}}
        assert (await admin.post(f"{url}/api/v1/servers", json=stored)).status_code == 201
        assert (await call("file")).status_code == 200
        assert refused(await call("stored", "add"))
        serving = site.services.serving
        path.write_text(_file(database, upstream,
                              '[upstreams.access]\ntools_deny = ["echo"]\n'
                              f'[[upstreams]]\nname = "added"\nurl = "{upstream}/mcp"\n'
                              'zones = ["loopback"]\n'))
        assert await serving.reload(path)
        assert refused(await call("file"))
        assert answer(await call("added"))["result"]["content"][0]["text"] == "hi"
        assert answer(await call("stored"))["result"]["content"][0]["text"] == "hi"
        assert refused(await call("stored", "add"))  # its own rules, as stored
        listed = (await admin.get(f"{url}/api/v1/servers")).json()["items"]
        assert {s["name"]: s["source"] for s in listed} == {
            "file": "config", "added": "config", "stored": "api"}
        path.write_text(_file(database, upstream))
        assert await serving.reload(path)
        assert (await call("added")).status_code == 404
        assert answer(await call("file"))["result"]["content"][0]["text"] == "hi"
        assert answer(await call("stored"))["result"]["content"][0]["text"] == "hi"


async def test_a_reload_applies_changed_policies_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """[policy]: a reload reads the Cedar files again; one that does not validate is refused
    with the file, the policy and the attribute named, and the running policies stay."""
    database = db_backends.url()
    _, secret = api_keys.create(database, "ops", [], role="admin")
    path, policies = tmp_path / "c.toml", tmp_path / "p.cedar"
    policy = '@id("p")\npermit(principal, action, resource) when {{ {} }};\n'
    policies.write_text(policy.format('context.hour >= 0'))
    extra = '[policy]\nfiles = ["p.cedar"]\n'

    def config(urls: Urls) -> Config:
        path.write_text(_file(database, urls.upstream, extra))
        return load(path, env={})

    async with gateway_stack(config, upstream=demo_app(), base_dir=tmp_path, client={
            "headers": {"Authorization": f"Bearer {secret}"}}) as site:

        async def echo() -> dict[str, Any]:
            response = await site.client.post(f"{site.url}/mcp/file", headers=MCP_HEADERS,
                                              content=orjson.dumps({
                                                  "jsonrpc": "2.0", "id": 1,
                                                  "method": "tools/call", "params": {
                                                      "name": "echo",
                                                      "arguments": {"text": "hi"}}}))
            return answer(response)

        assert echo_text(await echo()) == "hi"
        serving = site.services.serving
        policies.write_text(policy.format('principal.claims.departmnet == "x"'))
        assert await serving.reload(path) is False  # refused: nothing changed
        assert echo_text(await echo()) == "hi"
        policies.write_text(policy.format('context.input.text != "hi"'))
        assert await serving.reload(path)
        refused = await echo()
        assert refused["result"]["isError"] is True
        assert refused["result"]["structuredContent"]["code"] == "gateway.policy.denied"


def echo_text(answered: dict[str, Any]) -> str:
    return str(answered["result"]["content"][0]["text"])
