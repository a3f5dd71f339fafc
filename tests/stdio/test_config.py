"""The stdio keys of an `[[upstreams]]` table: each bad value refused with one line that names
the key, and a good table read as written."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import ConfigError, from_dict
from proxy.upstream.client import UpstreamRoute
from tests.helpers import jwt_auth

BASE = {"name": "files", "transport": "stdio", "command": "npx"}
OAUTH = {"client_id": "c", "authorization_endpoint": "https://idp.example/a",
         "token_endpoint": "https://idp.example/t"}


def load(upstream: dict[str, Any], **top: Any) -> Any:
    return from_dict({"upstreams": [upstream], **top}, env={})


def test_the_issue_s_example_is_read_as_written() -> None:
    cfg = load({**BASE, "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"],
                "env": {"LOG_LEVEL": "warn"}, "cwd": "/tmp", "process": "shared",
                "max_processes": 50, "idle_stop_s": 600})
    up = cfg.upstreams[0]
    assert up.stdio and up.url == "" and up.env == {"LOG_LEVEL": "warn"}
    route = UpstreamRoute.from_config(up)
    assert route.era == "legacy" and route.url_text == "http://stdio.invalid/files"


@pytest.mark.parametrize(("upstream", "top", "names"), [
    ({**BASE, "transport": "pipe"}, {}, "upstreams[0].transport"),
    ({"name": "files", "transport": "stdio"}, {}, "upstreams[0].command"),
    ({**BASE, "url": "http://x/mcp"}, {}, "upstreams[0].url"),
    ({"name": "web"}, {}, "upstreams[0].url"),
    ({"name": "web", "url": "http://x/mcp", "command": "npx"}, {}, "upstreams[0].command"),
    ({**BASE, "process": "per_request"}, {}, "upstreams[0].process"),
    ({**BASE, "max_processes": 0}, {}, "upstreams[0].max_processes"),
    ({**BASE, "idle_stop_s": 0}, {}, "upstreams[0].idle_stop_s"),
    ({**BASE, "start_timeout_s": -1}, {}, "upstreams[0].start_timeout_s"),
    ({**BASE, "memory_limit_mb": 64}, {}, "upstreams[0].memory_limit_mb"),
    ({**BASE, "open_files_limit": 3}, {}, "upstreams[0].open_files_limit"),
    ({**BASE, "cpu_limit_s": -5}, {}, "upstreams[0].cpu_limit_s"),
    ({**BASE, "max_line_bytes": 10}, {}, "upstreams[0].max_line_bytes"),
    ({**BASE, "env": {"BAD NAME": "x"}}, {}, "upstreams[0].env"),
    ({**BASE, "run_as": "no-such-user-here"}, {}, "upstreams[0].run_as"),
    ({**BASE, "era": "modern"}, {}, "upstreams[0].era"),
    ({**BASE, "headers": {"X-A": "b"}}, {}, "upstreams[0]"),
    ({**BASE, "token_env": "GITHUB_TOKEN"}, {}, "upstreams[0].token_env"),
    ({**BASE, "auth": "per_user", "oauth": OAUTH}, {"auth": jwt_auth()}, "upstreams[0].auth"),
    ({**BASE, "process": "per_user"}, {}, "upstreams[0].process"),
    ({**BASE, "auth": "per_user", "process": "per_user", "token_env": "T",
      "oauth": {"discover": True}}, {"auth": jwt_auth()}, "upstreams[0].oauth.discover"),
])
def test_a_bad_value_is_one_line_naming_the_key(upstream: dict[str, Any], top: dict[str, Any],
                                                 names: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(upstream, **top)
    message = str(refused.value)
    assert f"'{names}" in message and "\n" not in message


def test_a_per_user_stdio_upstream_with_its_token_variable() -> None:
    cfg = load({**BASE, "auth": "per_user", "process": "per_user", "token_env": "GH_TOKEN",
                "oauth": OAUTH}, auth=jwt_auth())
    assert cfg.upstreams[0].token_env == "GH_TOKEN"
