from pathlib import Path

import pytest

from proxy.config import ConfigError, from_dict, load

MINIMAL = {"upstreams": [{"name": "everything", "url": "http://127.0.0.1:3001/mcp"}]}


def test_defaults_are_the_documented_ones() -> None:
    cfg = from_dict(MINIMAL)
    assert cfg.server.listen == "127.0.0.1:8080"
    assert cfg.server.max_request_bytes == 4194304
    assert cfg.server.max_response_bytes == 16 * 1024 * 1024
    assert cfg.server.allowed_origins == []
    assert cfg.server.event_loop == "asyncio"
    assert cfg.server.gc_freeze is True
    assert cfg.server.gc_threshold == 10_000
    assert cfg.server.gc_sweep_s == 1.0
    assert cfg.auth.mode == "none"
    assert cfg.database.url == "sqlite:///tollhouse.db"
    up = cfg.upstream("everything")
    assert up is not None and up.timeout_s == 30 and up.total_timeout_s == 300


def test_example_config_loads(tmp_path: Path) -> None:
    example = Path(__file__).parents[3] / "config.example.toml"
    cfg = load(example, env={"EVERYTHING_TOKEN": "t0ken"})
    assert cfg.upstreams[0].headers["Authorization"] == "Bearer t0ken"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"server": {"lisen": "x"}}, "unknown key 'server.lisen'"),
        ({"server": {"max_request_bytes": "big"}},
         "'server.max_request_bytes' must be an integer, got a string"),
        ({"server": {"max_request_bytes": 0}}, "'server.max_request_bytes' must be greater than 0"),
        ({"server": {"max_response_bytes": -1}},
         "'server.max_response_bytes' must be greater than 0"),
        ({"server": {"max_response_bytes": "16M"}},
         "'server.max_response_bytes' must be an integer, got a string"),
        ({"server": {"listen": "nowhere"}}, "'server.listen' must be host:port"),
        ({"server": {"event_loop": "trio"}}, "'server.event_loop' must be asyncio or uvloop"),
        ({"server": {"gc_freeze": "yes"}}, "'server.gc_freeze' must be"),
        ({"server": {"gc_threshold": 99}}, "'server.gc_threshold' must be between 100 and 1000000"),
        ({"server": {"gc_threshold": 2_000_000}}, "'server.gc_threshold' must be between 100"),
        ({"server": {"gc_threshold": 7000.5}}, "'server.gc_threshold' must be an integer"),
        ({"server": {"gc_sweep_s": 0.001}},
         "'server.gc_sweep_s' must be 0 (no timed collections) or between 0.01 and 3600"),
        ({"server": {"gc_sweep_s": -1}}, "'server.gc_sweep_s' must be 0"),
        ({"server": {"gc_sweep_s": "1s"}}, "'server.gc_sweep_s' must be a number, got a string"),
        ({"metering": {"hook": "m:h", "keep_delivered_h": 0}},
         "'metering.keep_delivered_h' must be greater than 0"),
        ({"server": {"shutdown_grace_s": 0}},
         "'server.shutdown_grace_s' must be greater than 0 and at most 3600"),
        ({"server": {"shutdown_grace_s": 7200}},
         "'server.shutdown_grace_s' must be greater than 0 and at most 3600"),
        ({"server": {"sse_heartbeat_s": 0.01}},
         "'server.sse_heartbeat_s' must be 0 (no heartbeat) or between 0.05 and 3600"),
        ({"server": {"sse_heartbeat_s": -1}}, "'server.sse_heartbeat_s' must be 0"),
        ({"server": {"sse_heartbeat_s": "15s"}},
         "'server.sse_heartbeat_s' must be a number, got a string"),
        ({"server": {"public_url": "ftp://x"}}, "'server.public_url' must be an http://"),
        ({"server": {"allowed_origins": "http://a"}}, "'server.allowed_origins' must be an array"),
        ({"upstreams": [{"name": "a", "url": "not a url"}]}, "'upstreams[0].url' must be an http"),
        ({"upstreams": [{"name": "a", "url": "http://h:99999/"}]},
         "'upstreams[0].url' is not a valid URL"),
        ({"upstreams": [{"url": "http://h/"}]}, "missing required key 'upstreams[0].name'"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "timeout": 3}]},
         "unknown key 'upstreams[0].timeout'"),
        ({"upstreams": [{"name": "a/b", "url": "http://h/"}]}, "'upstreams[0].name' must be"),
        ({"upstreams": [{"name": "a", "url": "http://h/"}, {"name": "a", "url": "http://h/"}]},
         "repeats the upstream name 'a'"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "headers": {"X": 1}}]},
         "'upstreams[0].headers.X' must be a string"),
        ({"auth": {"mode": "magic"}}, "'auth.mode' must be one of none, jwt"),
        ({"auth": {"mode": "jwt", "issuers": [{"issuer": "i"}]}},
         "needs exactly one of jwks_url, public_key_pem or hs256_secret"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "access": {"allow_groups": ["g"]}}]},
         "'upstreams[0].access' restricts callers, which needs auth.mode"),
        ({"auth": {"mode": "jwt"}, "upstreams": [{"name": "a", "url": "http://h/",
                                                  "auth": "per_user"}]},
         "'upstreams[0].oauth' needs client_id, authorization_endpoint and token_endpoint"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "auth": "per_user",
                         "oauth": {"discover": True}}]},
         "needs auth.mode = \"jwt\""),
        ({"auth": {"mode": "jwt"}, "upstreams": [{
            "name": "a", "url": "http://h/", "auth": "per_user", "oauth": {"discover": True},
            "headers": {"Authorization": "Bearer shared"}}]},
         "sets Authorization, which a per_user upstream takes"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "auth": "sometimes"}]},
         "'upstreams[0].auth' must be static or per_user"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "identity": "cookie"}]},
         "'upstreams[0].identity' must be one of none, headers, jwt"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "access": {"tool_allow": ["x"]}}]},
         "unknown key 'upstreams[0].access.tool_allow'"),
        ({"server": {"listen": "0.0.0.0:8080"}}, "refused on a non-loopback listen address"),
        ({"auth": {"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "s",
                                                "algorithms": ["RS256"]}]}},
         "does not fit the key type"),
        ({"auth": {"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "s",
                                                "algorithms": ["none"]}]}},
         "unsupported algorithm 'none'"),
        ({"database": {"url": "mysql://x"}}, "'database.url' must be sqlite:///PATH"),
        ({"upstreams": [{"name": "a", "url": "http://h/", "headers": {"A": "${NOPE_NOT_SET}"}}]},
         "'upstreams[0].headers.A' refers to ${NOPE_NOT_SET}, which is not set"),
    ],
)
def test_bad_config_names_the_key(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(raw, env={})
    text = str(info.value)
    assert message in text
    assert "\n" not in text


# Found by the config fuzz target (tests/fuzz/fuzz_config.py): a value or a key the message
# echoes could carry a line break, and the one line became two.
@pytest.mark.parametrize("raw", [
    {"auth": {"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "k",
                                          "algorithms": ["HS256", "E\n56"]}]}},
    {"server": {"listen\r\nforged: yes": 1}},
    {"upstreams": [{"name": "a", "url": "http://h/", "access": {"x\u2028y": 1}}]},
])
def test_an_echoed_key_or_value_stays_on_the_line(raw: dict) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(raw, env={})
    text = str(info.value)
    assert text.isprintable() and text.startswith("config: ")
    assert "\\n" in text or "\\u2028" in text


def test_env_substitution_does_not_leak_value_in_errors() -> None:
    cfg = from_dict({"upstreams": [{"name": "a", "url": "http://h/",
                                    "headers": {"Authorization": "Bearer ${TOK}"}}]},
                    env={"TOK": "s3cret"})
    assert cfg.upstreams[0].headers["Authorization"] == "Bearer s3cret"


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(bad)
    with pytest.raises(ConfigError, match="file not found"):
        load(tmp_path / "missing.toml")


def test_jwt_public_key_file_must_exist(tmp_path: Path) -> None:
    raw = {"auth": {"mode": "jwt", "issuers": [{"issuer": "i", "public_key_pem": "k.pem"}]}}
    with pytest.raises(ConfigError, match="names a file that does not exist"):
        from_dict(raw, base_dir=tmp_path)
    (tmp_path / "k.pem").write_text("-----BEGIN PUBLIC KEY-----\n")
    assert from_dict(raw, base_dir=tmp_path).auth.issuers[0].public_key_pem == "k.pem"
