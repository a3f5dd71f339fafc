"""docs/config-reference.md is what `tollhouse config reference` generates from the config types
(issue 46), and what the generator reads is what the config loader and its checks apply."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import pytest

from proxy.config import ConfigError, from_dict
from proxy.config.reference import (
    CHOICES,
    COMMAND,
    DOCS_DIR,
    PAGES,
    field_docs,
    keys,
    link,
    render,
)
from proxy.config.tables import ServerConfig, StateConfig, UpstreamConfig
from proxy.runtime.cli import main

COMMITTED = DOCS_DIR / "config-reference.md"


def test_the_committed_reference_is_what_the_command_generates() -> None:
    committed = COMMITTED.read_text(encoding="utf-8") if COMMITTED.is_file() else ""
    generated = render()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), generated.splitlines(True),
                                        "docs/config-reference.md (committed)", "generated", n=1))
    assert committed == generated, (
        f"docs/config-reference.md differs from what the config types generate; regenerate it "
        f"with `{COMMAND}` and commit it:\n{diff[:4000]}")


def test_the_command_prints_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out == render()


def test_every_key_is_listed_once_with_its_toml_path() -> None:
    paths = [k.path for k in keys()]
    assert len(paths) == len(set(paths))
    by_path = {k.path: k for k in keys()}
    assert by_path["server.listen"].default == '"127.0.0.1:8080"'
    assert by_path["upstreams"].kind == "array of tables"
    assert by_path["upstreams[].name"].default == "required"
    assert by_path["upstreams[].access.tools_deny"].kind == "array of strings"
    assert by_path["upstreams[].placeholders.<name>.pattern"].default == '"[a-z0-9-]{1,63}"'
    assert by_path["upstreams[].headers"].kind == "table of strings"
    assert by_path["policy.files"].kind == "array of strings"
    assert by_path["policy.mode"].choices == ("enforce", "shadow")  # its Literal type
    assert by_path["server.gc_freeze"].default == "true"
    assert by_path["server.session_idle_timeout_s"].kind == "number"


def test_what_a_key_does_is_the_comment_on_its_field() -> None:
    assert field_docs(StateConfig)["key_prefix"] == ("every key and pub/sub channel starts "
                                                    "with it")
    above = field_docs(ServerConfig)["max_response_bytes"]
    assert above.startswith("an answer the gateway must hold whole to rewrite it")
    assert field_docs(UpstreamConfig)["max_line_bytes"] == ("one JSON-RPC message on stdout, "
                                                           "at most")
    assert field_docs(UpstreamConfig)["transport"].startswith("a local MCP server")
    tables = {k.path: k.doc for k in keys() if k.table}  # a table's: its class's docstring
    assert tables["upstreams[].screening"].startswith("`[upstreams.screening]`: the definitions")


def test_links_go_to_pages_and_headings_that_exist(tmp_path: Path) -> None:
    (tmp_path / "operations.md").write_text("# Operating\n\n## Large answers\n\n```\n# x\n```\n")
    assert link("server.max_response_bytes", tmp_path) == (
        "[Operating › Large answers](operations.md#large-answers)")
    assert link("server.sse_heartbeat_s", tmp_path) == "[Operating](operations.md)"
    assert link("policy.files", tmp_path) == ""  # no page yet: no link, never a broken one
    assert link("server.workers", tmp_path) == "[Operating](operations.md)"  # the section's


def test_every_listed_path_is_a_key() -> None:
    paths = {k.path for k in keys()}
    assert set(CHOICES) <= paths
    assert {p.removesuffix("[]") for p in paths} >= set(PAGES)


# enough of a table for the key under test to be checked: the array tables' required keys
_SEEDS: dict[str, dict[str, Any]] = {
    "auth.issuers": {"issuer": "https://login.example", "jwks_url": "https://login.example/k"},
    "upstreams": {"name": "up", "url": "http://127.0.0.1:9/mcp"},
    "rate_limits": {"name": "r"},
    "guardrails": {"name": "g"},
    "audit.exports": {"name": "siem", "kind": "syslog", "url": "tcp://127.0.0.1:6514"},
}


def _raw(path: str, value: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    table = raw
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.endswith("[]"):
            seed = dict(_SEEDS[".".join(parts[:i] + [part.removesuffix("[]")])])
            table[part.removesuffix("[]")] = [seed]
            table = seed
        else:
            table = table.setdefault(part, {})
    table[parts[-1]] = value
    if path == "upstreams[].process":
        raw["upstreams"][0] |= {"transport": "stdio", "command": "srv", "url": ""}
    return raw


@pytest.mark.parametrize("path", sorted(CHOICES))
def test_a_key_with_allowed_values_refuses_any_other_naming_them(path: str) -> None:
    """The reference's allowed values are the check's: a word outside them is refused with
    a line that names the key and every word it allows."""
    by_path = {k.path: k for k in keys()}
    kind = by_path[path].kind
    value: Any = (["bogus"] if kind.startswith("array") else {"x": "bogus"}
                  if kind.startswith("table") else "bogus")
    with pytest.raises(ConfigError) as refused:
        from_dict(_raw(path, value))
    message = str(refused.value)
    assert path.split(".")[-1] in message, message
    for word in CHOICES[path]:
        assert word in message, (word, message)
