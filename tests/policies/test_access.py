"""The access policy with plain objects: caller rules, tool profiles per group, prompts and
resources, and the */list rewriter."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from policies.access import Access
from proxy.auth.principal import Principal
from proxy.config import from_dict
from proxy.errors import Forbidden, HiddenTool
from tests.builders import context as ctx
from tests.builders import message as msg
from tests.builders import principal

ACCESS = {"allow_groups": ["eng"], "allow_subjects": ["root"], "allow_keys": ["k1"],
          "tools_allow": ["get_*", "search_*"], "tools_deny": ["*_secret"],
          "group_tools": {"ops": {"tools_allow": ["deploy"], "tools_deny": ["search_*"]}},
          "prompts_deny": ["internal-*"], "resources_allow": ["file:///public/*"]}
POLICY = Access(from_dict({
    "auth": {"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "s" * 32,
                                          "algorithms": ["HS256"]}]},
    "upstreams": [{"name": "e", "url": "http://u/", "access": ACCESS},
                  {"name": "open", "url": "http://u/"}]}, env={}))


def who(subject: str = "alice", groups: tuple[str, ...] = ("eng",), key: str | None = None
        ) -> Principal:
    """A caller, in group `eng` unless told otherwise."""
    return principal(subject, groups=groups, key=key)


@pytest.mark.parametrize(
    ("caller", "admitted"),
    [(who(), True), (who("root", ()), True), (who("bob", ("sales",)), False),
     (who("bot", (), key="k1"), True), (who("bot", (), key="k2"), False)],
)
async def test_caller_rules(caller: Principal, admitted: bool) -> None:
    call = msg("tools/list")
    if admitted:
        await POLICY.check(call, ctx(caller))
    else:
        with pytest.raises(Forbidden) as info:
            await POLICY.check(call, ctx(caller))
        assert info.value.audit_reason == "access: caller not allowed on endpoint e"
    await POLICY.check(call, ctx(caller, "open"))  # an endpoint without rules admits all


@pytest.mark.parametrize(
    ("groups", "tool", "denial"),
    [(("eng",), "get_user", None), (("eng",), "search_all", None),
     (("eng",), "delete_user", "access: tool delete_user matches no allow pattern"),
     (("eng",), "get_secret", "access: tool get_secret matches deny pattern '*_secret'"),
     (("eng", "ops"), "deploy", None),
     (("eng", "ops"), "search_all", "access: tool search_all matches deny pattern 'search_*'"),
     (("eng",), "deploy", "access: tool deploy matches no allow pattern")],
)
async def test_tool_profiles(groups: tuple[str, ...], tool: str, denial: str | None) -> None:
    call = msg("tools/call", name=tool, arguments={})
    if denial is None:
        await POLICY.check(call, ctx(who(groups=groups)))
        return
    with pytest.raises(HiddenTool) as info:
        await POLICY.check(call, ctx(who(groups=groups)))
    assert info.value.audit_reason == denial
    assert (info.value.code, info.value.wire_message) == (-32602, f"Unknown tool: {tool}")


async def test_prompts_and_resources() -> None:
    await POLICY.check(msg("prompts/get", name="summary"), ctx(who()))
    with pytest.raises(HiddenTool) as info:
        await POLICY.check(msg("prompts/get", name="internal-x"), ctx(who()))
    assert info.value.wire_message == "Unknown prompt: internal-x"
    await POLICY.check(msg("resources/read", uri="file:///public/a"), ctx(who()))
    with pytest.raises(HiddenTool) as info:
        await POLICY.check(msg("resources/read", uri="file:///etc/passwd"), ctx(who()))
    assert info.value.wire_message == "Resource not found: file:///etc/passwd"


@pytest.mark.parametrize(
    ("method", "params", "wire"),
    [("completion/complete", {"ref": {"type": "ref/prompt", "name": "internal-x"},
                              "argument": {"name": "a", "value": "b"}},
      "Unknown prompt: internal-x"),
     ("completion/complete", {"ref": {"type": "ref/resource", "uri": "file:///etc/{name}"},
                              "argument": {"name": "name", "value": "p"}},
      "Resource not found: file:///etc/{name}"),
     ("resources/subscribe", {"uri": "file:///etc/passwd"}, "Resource not found: file:///etc/passwd"),
     ("resources/unsubscribe", {"uri": "file:///etc/passwd"},
      "Resource not found: file:///etc/passwd")],
)
async def test_every_method_naming_a_prompt_or_resource_is_decided_by_its_rules(
        method: str, params: dict[str, Any], wire: str) -> None:
    with pytest.raises(HiddenTool) as info:
        await POLICY.check(msg(method, **params), ctx(who()))
    assert info.value.wire_message == wire
    allowed = orjson.loads(orjson.dumps(params).replace(b"internal-x", b"summary")
                           .replace(b"file:///etc/", b"file:///public/"))
    await POLICY.check(msg(method, **allowed), ctx(who()))


@pytest.mark.parametrize("ref", [None, "ref/prompt", {"type": "ref/other", "name": "internal-x"},
                                 {"type": "ref/prompt", "name": 3}])
async def test_a_completion_naming_nothing_it_knows_is_left_to_the_upstream(ref: Any) -> None:
    await POLICY.check(msg("completion/complete", ref=ref, argument={}), ctx(who()))


def test_list_rewriter_filters_per_caller() -> None:
    tools = {"tools": [{"name": n} for n in ("get_a", "search_b", "deploy", "get_secret", "x")],
             "nextCursor": "c"}
    rewrite = POLICY.rewriter(msg("tools/list"), ctx(who()))
    assert rewrite is not None and rewrite(tools)
    assert tools == {"tools": [{"name": "get_a"}, {"name": "search_b"}], "nextCursor": "c"}
    ops = {"tools": [{"name": n} for n in ("get_a", "search_b", "deploy")]}
    ops_rewrite = POLICY.rewriter(msg("tools/list"), ctx(who(groups=("eng", "ops"))))
    assert ops_rewrite is not None and ops_rewrite(ops)
    assert [t["name"] for t in ops["tools"]] == ["get_a", "deploy"]
    templates = {"resourceTemplates": [{"uriTemplate": "file:///public/{x}"},
                                       {"uriTemplate": "file:///private/{x}"}]}
    rewrite_t = POLICY.rewriter(msg("resources/templates/list"), ctx(who()))
    assert rewrite_t is not None and rewrite_t(templates)
    assert templates == {"resourceTemplates": [{"uriTemplate": "file:///public/{x}"}]}
    untouched = {"tools": [{"name": "get_a"}]}
    assert rewrite is not None and not rewrite(untouched)


def test_no_rewriter_where_nothing_is_hidden() -> None:
    assert POLICY.rewriter(msg("tools/list"), ctx(who(), "open")) is None
    assert POLICY.rewriter(msg("tools/call", name="x"), ctx(who())) is None


def test_a_list_filtered_per_caller_is_never_publicly_cacheable() -> None:
    result = {"tools": [{"name": "get_a"}], "resultType": "complete", "ttlMs": 60000,
              "cacheScope": "public"}
    rewrite = POLICY.rewriter(msg("tools/list"), ctx(who()))
    assert rewrite is not None and rewrite(result)
    assert result["cacheScope"] == "private" and result["ttlMs"] == 60000


def test_remembered_verdicts_are_bounded_and_stay_right() -> None:
    """A profile remembers each name's verdict (the same few names come on every call); a
    flood of distinct names keeps at most a bound of them and every answer stays right."""
    from policies.access import _REMEMBERED, Profile

    profile = Profile(("read_*",), ("read_secret*",))
    for i in range(_REMEMBERED + 500):
        name = f"read_{i}" if i % 3 else f"write_{i}"
        assert (profile.denial(name) is None) == bool(i % 3)
        assert len(profile._verdicts) <= _REMEMBERED
    assert profile.denial("read_secret_key") == "matches deny pattern 'read_secret*'"
    assert profile.denial("read_secret_key") == "matches deny pattern 'read_secret*'"  # kept


def test_a_callers_groups_get_one_combined_profile_per_distinct_set() -> None:
    from policies.access import _compile
    from proxy.config import AccessConfig

    cfg = from_dict({"upstreams": [{"name": "e", "url": "http://127.0.0.1:1/mcp", "access": {
        "tools_allow": ["a"], "group_tools": {"ops": {"tools_allow": ["b"]},
                                              "dev": {"tools_deny": ["a"]}}}}]})
    rules = _compile(cfg.upstreams[0].access)
    assert isinstance(cfg.upstreams[0].access, AccessConfig)
    ops = principal("s", groups=("ops",))
    both = principal("t", groups=("ops", "dev"))
    assert rules.tool_profile(ops).denial("b") is None
    assert rules.tool_profile(both).denial("a") == "matches deny pattern 'a'"
    assert rules.tool_profile(ops) is rules.tool_profile(principal("u", groups=("ops",)))
    assert rules.tool_profile(principal("v")) is rules.tools
