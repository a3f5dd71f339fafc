"""What a reload applies and what it keeps (proxy.reload), on plain configs; the signal
itself, on a real process, is tests/proxy/test_signals.py."""

from __future__ import annotations

from typing import Any

from proxy.config import Config, from_dict
from proxy.reload import applied, fixed_changes

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
