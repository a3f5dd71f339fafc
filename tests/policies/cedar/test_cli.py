"""`tollhouse policy check | test | explain | schema` on a config with policy files, the tools
given with --tools or read from the database as last seen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.runtime.cli import main
from proxy.storage.db import Database

TOOLS = {"github": [{"name": "create_issue", "inputSchema": {
    "type": "object", "required": ["repo"],
    "properties": {"repo": {"type": "string"}, "title": {"type": "string"}}}}]}

POLICY = '''
@id("acme-only") @reason("only acme repositories")
permit(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"github/create_issue")
when { principal.groups.contains("sre") && context.input.repo like "acme/*" };
@id("no-infra") @mode("shadow") @reason("infra is frozen")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"github/create_issue")
when { context.input.repo == "acme/infra" };
'''

CASES = '''
[[case]]
principal = { subject = "alice", issuer = "https://idp.example", groups = ["sre"] }
endpoint = "github"
tool = "create_issue"
arguments = { repo = "acme/infra", title = "x" }
expect = "allow"

[[case]]
name = "outside acme"
principal = { subject = "bob", issuer = "https://idp.example", groups = ["sre"] }
endpoint = "github"
tool = "create_issue"
arguments = { repo = "evil/x" }
expect = "allow"
'''


@pytest.fixture
def world(tmp_path: Path) -> Path:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "github.cedar").write_text(POLICY)
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "cases.toml").write_text(CASES)
    config = tmp_path / "tollhouse.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/t.db"\n\n'
                      '[policy]\nfiles = ["policies/*.cedar"]\nclaims = ["department"]\n')
    return tmp_path


def _run(world: Path, *argv: str) -> int:
    return main(["policy", argv[0], "--config", str(world / "tollhouse.toml"), *argv[1:]])


def test_check_passes_and_names_a_problem(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(world, "check", "--tools", str(world / "tools.json")) == 0
    assert "2 policies valid (1 shadow)" in capsys.readouterr().out
    (world / "policies" / "bad.cedar").write_text(
        '@id("typo") permit(principal, action, resource == Tollhouse::Tool::"github/create_issue")'
        ' when { context.input.reop == "x" };')
    assert _run(world, "check", "--tools", str(world / "tools.json")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tollhouse: policy: policies/bad.cedar: policy typo: ")
    assert "input.reop" in err and "\n" not in err


def test_check_without_the_tools_refuses_what_names_their_arguments(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(world, "check") == 2  # an empty database: no tool's arguments are known
    assert "input.repo" in capsys.readouterr().err


def test_test_names_each_mismatch(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(world, "test", "--tools", str(world / "tools.json"),
                str(world / "cases.toml")) == 1
    out = capsys.readouterr().out
    assert "FAIL case 2 (outside acme: tools/call github/create_issue): expected allow, got " \
           "deny (no deciding policy; reason: no policy permits this call)" in out
    assert "case 1" not in out and "1 of 2 cases as expected" in out
    (world / "cases.toml").write_text(CASES.replace(
        'repo = "evil/x" }\nexpect = "allow"', 'repo = "evil/x" }\nexpect = "deny"'))
    assert _run(world, "test", "--tools", str(world / "tools.json"),
                str(world / "cases.toml")) == 0


def test_explain_shows_the_deciding_and_the_shadow_policies(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(world, "explain", "--tools", str(world / "tools.json"),
                str(world / "cases.toml"), "--case", "1") == 0
    out = capsys.readouterr().out
    assert "decision: allow" in out and "permitted by: acme-only" in out
    assert "shadow decision: deny (policies: no-infra; reason: infra is frozen)" in out
    assert "listed for this caller: yes" in out and "case 2" not in out


def test_a_bad_case_file_is_a_config_error(world: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (world / "cases.toml").write_text('[[case]]\nendpoint = "github"\nexpect = "maybe"\n')
    assert _run(world, "test", "--tools", str(world / "tools.json"),
                str(world / "cases.toml")) == 2
    assert "case 1: principal needs subject" in capsys.readouterr().err


def test_schema_from_the_tools_last_seen(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Database(f"sqlite:///{world}/t.db") as database, database.transaction() as conn:
        conn.execute("INSERT INTO server_tools (server, tools, tools_hash, tools_seen_at) "
                     "VALUES (?, ?, ?, ?)",
                     ("github", json.dumps([{"name": "create_issue"}, {"name": "close"}]), "h",
                      1.0))
        conn.execute("INSERT INTO tool_pins (endpoint, name, approved, definition, updated_at) "
                     "VALUES (?, ?, ?, ?, ?)",
                     ("github", "create_issue", "d", json.dumps(TOOLS["github"][0]), 1.0))
    assert _run(world, "schema") == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["inputs"]["Tool::github/create_issue"]["attributes"]["repo"]["required"]
    assert doc["inputs"]["Tool::github/close"]["attributes"] == {}
    assert "department" in doc["schema"]["Tollhouse"]["entityTypes"]["Caller"]["shape"][
        "attributes"]["claims"]["attributes"]
    assert "2 tools as last seen" in captured.err and "1 of them" in captured.err
    assert _run(world, "check") == 0  # now the stored definition types the arguments


def test_serve_stops_on_a_policy_that_does_not_validate_with_one_line(
        world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Start-up checks the policies before anything serves: exit 2, one line naming the file,
    the policy and the attribute (a policy reading arguments of a tool not seen yet is
    checked in everything else, so this one, on the caller, is caught)."""
    (world / "policies" / "typo.cedar").write_text(
        '@id("typo")\npermit(principal, action, resource) '
        'when { principal.claims.departmnet == "x" };\n')
    assert main(["serve", "--config", str(world / "tollhouse.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "typo.cedar" in err[0] and "typo" in err[0] and "departmnet" in err[0]
