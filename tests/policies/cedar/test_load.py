"""Policies are read from the configured globs, named, and validated against the generated
schema when loaded: a policy naming what does not exist is refused with one line naming the
file, the policy and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.cedar import Catalog, PolicyError, Target, load, parse, validate
from policies.cedar.schema import input_type
from tests.policies.cedar.helpers import catalog

CALL = 'action == Tollhouse::Action::"tools/call"'


def _refused(text: str, file: str = "p.cedar") -> str:
    with pytest.raises(PolicyError) as caught:
        validate(parse(text, file), catalog())
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_argument_no_reachable_tool_has_is_refused() -> None:
    message = _refused(f'@id("cap") permit(principal, {CALL}, resource) when '
                       '{ context.input.amount.lessThan(decimal("5.0")) };')
    assert message.startswith("policy: p.cedar: policy cap: ")
    assert "input.amount" in message and "not found" in message


def test_an_argument_of_the_tool_in_scope_is_accepted() -> None:
    validate(parse(f'permit(principal, {CALL}, resource == Tollhouse::Tool::"pay/transfer") '
                   'when { context.input.amount.lessThan(decimal("5.0")) };', "p.cedar"),
             catalog())


def test_a_misspelt_argument_is_refused() -> None:
    message = _refused(f'permit(principal, {CALL}, resource == Tollhouse::Tool::"pay/transfer")'
                       ' when { context.input.amuont == 1 };')
    assert "p.cedar:1" in message and "input.amuont" in message
    assert "tool pay/transfer" in message


def test_an_optional_argument_needs_has() -> None:
    message = _refused(f'permit(principal, {CALL}, resource == Tollhouse::Tool::"pay/transfer")'
                       ' when { context.input.count == 1 };')
    assert "optional attribute `input.count`" in message


@pytest.mark.parametrize(("text", "named"), [
    (f'permit(principal, {CALL}, resource) when {{ principal.claims.dept == "x" }};', "claims.dept"),
    (f'permit(principal, {CALL}, resource) when {{ principal.rank == 1 }};', "rank"),
    (f'permit(principal, {CALL}, resource) when {{ resource.owner == "x" }};', "owner"),
    ('permit(principal, action == Tollhouse::Action::"tools/delete", resource);', "tools/delete"),
    ('permit(principal is Tollhouse::User, action, resource);', "Tollhouse::User"),
    (f'permit(principal, {CALL}, resource) when {{ context.hour == "noon" }};', "Long"),
])
def test_what_does_not_exist_is_named(text: str, named: str) -> None:
    assert named in _refused(text)


def test_a_parse_error_names_the_file() -> None:
    with pytest.raises(PolicyError, match=r"^policy: bad\.cedar: "):
        parse("permit(principal, action, resource) when {", "bad.cedar")


def test_ids_reasons_and_modes(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "a.cedar").write_text(
        f'@id("first") @reason("why") forbid(principal, {CALL}, resource);\n'
        f'@mode("shadow") permit(principal, {CALL}, resource);\n')
    (tmp_path / "policies" / "b.cedar").write_text(f'permit(principal, {CALL}, resource);\n')
    policies = load(["policies/*.cedar"], tmp_path, catalog())
    assert [(p.id, p.file, p.effect, p.mode, p.reason) for p in policies] == [
        ("first", "policies/a.cedar", "forbid", "enforce", "why"),
        ("policies/a.cedar:2", "policies/a.cedar", "permit", "shadow", None),
        ("policies/b.cedar:1", "policies/b.cedar", "permit", "enforce", None)]
    everything = load(["policies/*.cedar"], tmp_path, catalog(), mode="shadow")
    assert {p.mode for p in everything} == {"shadow"}


def test_a_glob_matching_nothing_and_a_duplicate_id_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="'none/\\*.cedar' matches no file"):
        load(["none/*.cedar"], tmp_path, catalog())
    (tmp_path / "a.cedar").write_text(f'@id("x") permit(principal, {CALL}, resource);')
    (tmp_path / "b.cedar").write_text(f'@id("x") permit(principal, {CALL}, resource);')
    with pytest.raises(PolicyError, match="policy id 'x' is also used in a.cedar"):
        load(["*.cedar"], tmp_path, catalog())


def test_a_bad_mode_annotation_is_refused() -> None:
    with pytest.raises(PolicyError, match='policy p.cedar:1: @mode must be "shadow"'):
        parse(f'@mode("dry") permit(principal, {CALL}, resource);', "p.cedar")


def test_json_schema_types_map_to_cedar() -> None:
    record = input_type({"type": "object", "required": ["s"], "properties": {
        "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
        "b": {"type": "boolean"}, "e": {"enum": ["a", "b"]}, "opt": {"type": ["string", "null"]},
        "o": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "a": {"type": "array", "items": {"type": "string"}},
        "skipped": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "loose": {"type": "array"}}})
    attrs = record["attributes"]
    assert sorted(attrs) == ["a", "b", "e", "i", "n", "o", "opt", "s"]
    assert attrs["s"] == {"type": "String", "required": True}
    assert attrs["i"]["type"] == "Long" and not attrs["i"]["required"]
    assert attrs["n"] == {"type": "Extension", "name": "decimal", "required": False}
    assert attrs["a"]["element"] == {"type": "String"}
    assert attrs["o"]["attributes"]["x"]["type"] == "Long"


def test_the_schema_is_deterministic_and_names_the_model() -> None:
    first = catalog().schema_json()
    again = Catalog(list(reversed(catalog().targets.values())), claims=["department"],
                    attributes=["team"]).schema_json()
    assert first == again
    schema = json.loads(first)["schema"]["Tollhouse"]
    assert sorted(schema["entityTypes"]) == ["Caller", "Endpoint", "Prompt", "Resource", "Tool"]
    assert {"tools/call", "resources/read", "prompts/get", "tools/list"} <= set(schema["actions"])
    caller = schema["entityTypes"]["Caller"]["shape"]["attributes"]
    assert caller["claims"]["attributes"] == {"department": {"type": "String", "required": False}}
    assert json.loads(first)["inputs"]["Tool::pay/transfer"]["attributes"]["amount"]["required"]


def test_a_tool_not_seen_has_no_arguments_to_name() -> None:
    cat = Catalog([Target.tool("pay", {"name": "balance"})])
    with pytest.raises(PolicyError, match="input.amount"):
        validate(parse(f'permit(principal, {CALL}, resource == Tollhouse::Tool::"pay/transfer")'
                       ' when { context.input.amount == 1 };', "p.cedar"), cat)
