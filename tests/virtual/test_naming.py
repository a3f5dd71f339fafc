"""Exposed names, URIs, cursors and the start-up collision checks of virtual endpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, from_dict
from proxy.errors import InvalidParams
from proxy.runtime.cli import main
from proxy.virtual import naming
from proxy.virtual.cursor import Cursors

UPSTREAMS = [{"name": n, "url": f"http://{n}.test/mcp"} for n in ("github", "crm", "search")]


def test_plain_names_are_member_separator_name() -> None:
    assert naming.exposed("github", "create_issue", "__") == "github__create_issue"
    assert naming.owner("github__create_issue", ["crm", "github"], "__") == \
        ("github", "create_issue")
    assert naming.owner("jira__x", ["crm", "github"], "__") is None


def test_long_or_unruly_names_are_shortened_deterministically_without_collisions() -> None:
    member = "m" * 40
    names = [f"tool_{'x' * 30}_{i}" for i in range(50)] + ["has space", "has/slash"]
    exposed = [naming.exposed(member, n, "__") for n in names]
    assert all(naming.NAME_RULE.match(e) for e in exposed)  # at most 64, MCP name rules
    assert len(set(exposed)) == len(exposed)
    assert exposed == [naming.exposed(member, n, "__") for n in names]  # stable
    # a shortened name is not read back from its prefix: only a member's list tells it
    assert naming.owner(exposed[0], [member], "__") != (member, names[0])


def test_uris_round_trip() -> None:
    uri = naming.exposed_uri("crm", "file:///a/b?c=d")
    assert naming.member_uri(uri, ["crm"]) == ("crm", "file:///a/b?c=d")
    assert naming.member_uri(uri, ["github"]) is None
    assert naming.member_uri("file:///a", ["crm"]) is None


def test_ui_uris_keep_their_scheme_and_round_trip() -> None:
    """An MCP Apps UI resource stays `ui://` (a host renders nothing else), its member the
    first segment; a URI template's expansion reads back the same way."""
    uri = naming.exposed_uri("apps", "ui://get-time/mcp-app.html")
    assert uri == "ui://apps/get-time/mcp-app.html"
    assert naming.member_uri(uri, ["crm", "apps"]) == ("apps", "ui://get-time/mcp-app.html")
    assert naming.exposed_uri("apps", "ui://widgets/{id}") == "ui://apps/widgets/{id}"
    assert naming.member_uri("ui://apps/widgets/7", ["apps"]) == ("apps", "ui://widgets/7")
    assert naming.member_uri("ui://apps", ["apps"]) is None  # no path: nothing of a member's
    # the member's own URI names no member: it reaches none
    assert naming.member_uri("ui://get-time/mcp-app.html", ["apps"]) is None
    assert naming.member_uri("tollhouse://apps/ui://get-time/x", ["apps"]) == \
        ("apps", "ui://get-time/x")  # the wrapped form still reads back
    # other schemes are wrapped as before, an uppercase UI:// too (only ui:// is MCP Apps')
    assert naming.exposed_uri("apps", "UI://x/y") == "tollhouse://apps/UI://x/y"
    assert naming.exposed_uri("apps", "file:///a") == "tollhouse://apps/file:///a"


def test_cursors_are_bound_to_caller_endpoint_and_list() -> None:
    cursors = Cursors(b"k")
    sealed = cursors.seal("team", "tools/list", "iss|alice", {"crm": "p2"})
    assert cursors.open(sealed, "team", "tools/list", "iss|alice") == {"crm": "p2"}
    body, _, mac = sealed.partition(".")
    for forged, caller, endpoint, method in [
            (sealed, "iss|bob", "team", "tools/list"),  # another caller's replay
            (sealed, "iss|alice", "other", "tools/list"),
            (sealed, "iss|alice", "team", "prompts/list"),
            (body + "." + mac[:-2] + "AA", "iss|alice", "team", "tools/list"),
            ("eyJjcm0iOiJwOSJ9." + mac, "iss|alice", "team", "tools/list"),
            ("garbage", "iss|alice", "team", "tools/list"), (42, "iss|alice", "team", "x")]:
        with pytest.raises(InvalidParams):
            cursors.open(forged, endpoint, method, caller)
    assert Cursors(b"other key").seal("team", "tools/list", "iss|alice", {"crm": "p2"}) \
        != sealed


def config(**endpoint: object) -> dict[str, object]:
    return {"upstreams": UPSTREAMS, "endpoints": [
        {"name": "team", "members": ["github", "crm", "search"], **endpoint}]}


@pytest.mark.parametrize(("endpoint", "words"), [
    ({"aliases": {"crm__lookup": "github:create_issue"}},
     ["'crm__lookup'", "github:create_issue", "'crm'", "'lookup'"]),
    ({"name": "github"}, ["'github'", "upstream"]),
    ({"members": ["git", "git__hub"]}, ["'git'", "'git__hub'", "separator"]),
    ({"members": ["crm", "crm"]}, ["'crm'", "twice"]),
    ({"aliases": {"x": "jira:create"}}, ["'x'", "jira:create"]),
    ({"aliases": {"x": "github"}}, ["'x'", "<member>:<tool>"]),
    ({"separator": "/"}, ["separator"]),
    ({"list_timeout_s": 0}, ["list_timeout_s"]),
    ({"members": []}, ["members"]),
])
def test_collisions_the_config_shows_stop_start_up(endpoint: dict[str, object],
                                                   words: list[str]) -> None:
    raw = config(**endpoint)
    if "git" in str(endpoint.get("members")):
        raw["upstreams"] = [*UPSTREAMS, {"name": "git", "url": "http://git.test/mcp"},
                            {"name": "git__hub", "url": "http://hub.test/mcp"}]
    with pytest.raises(ConfigError) as caught:
        from_dict(raw, env={})
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_an_alias_of_its_own_namespaced_name_is_no_collision() -> None:
    cfg = from_dict(config(aliases={"github__create_issue": "github:create_issue",
                                    "create_issue": "github:create_issue"}), env={})
    assert cfg.endpoints[0].aliases["create_issue"] == "github:create_issue"


def test_a_collision_exits_2_with_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tollhouse.toml"
    path.write_text('[[upstreams]]\nname = "github"\nurl = "http://github.test/mcp"\n'
                    '[[endpoints]]\nname = "github"\nmembers = ["github"]\n')
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "endpoint 'github'" in err
