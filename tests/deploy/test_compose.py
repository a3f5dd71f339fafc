"""deploy/compose.yaml, its gateway config and its nginx: two replicas on one Redis and one
PostgreSQL, secrets from the environment only, a healthcheck on every service, and an nginx that
keeps SSE streams whole. (.ci/deploy-check validates the file against the Compose schema and
runs nginx -t; this reads what those cannot judge.)"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no stubs in the lint tools

from tests.deploy.files import DEPLOY, compose_interpolate, compose_variables, load_config

SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|_AUTH$|_KEY$|_KEYS$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text("utf-8"))
    return loaded


def _dotenv_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (DEPLOY / ".env.example").read_text("utf-8").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def _filled_dotenv() -> dict[str, str]:
    """deploy/.env as a person fills it in: .env.example with each empty value set."""
    return {key: value or f"{key.lower().replace('_', '')}0x" for key, value in
            _dotenv_example().items()}


def _gateway_env(compose: dict[str, Any]) -> dict[str, str]:
    env = compose["services"]["gateway"]["environment"]
    return {key: compose_interpolate(str(value), _filled_dotenv()) for key, value in env.items()}


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in [str(key), *_strings(value)]]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [str(node)]


def test_two_gateway_replicas_on_one_redis_and_one_postgresql(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"gateway", "nginx", "postgres", "redis"}
    gateway = services["gateway"]
    assert gateway["deploy"]["replicas"] == 2
    assert gateway["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert "ports" not in gateway  # reached through nginx only
    mount = next(v for v in gateway["volumes"] if v.endswith(":/etc/tollhouse/config.toml:ro"))
    config_file = DEPLOY / mount.split(":")[0]
    env = _gateway_env(compose)
    assert env["TOLLHOUSE_CONFIG"] == "/etc/tollhouse/config.toml"
    # the file both replicas read, through the real loader, with the environment compose gives
    cfg = load_config(config_file.read_text("utf-8"), env)
    assert cfg.state.url.startswith("redis://") and "@redis:6379/" in cfg.state.url
    assert cfg.database.url.startswith("postgresql://") and "@postgres:5432/" in cfg.database.url
    assert cfg.server.listen == "0.0.0.0:8080"
    assert cfg.auth.mode == "jwt"
    # Redis's and PostgreSQL's passwords are the ones those services are started with
    dotenv = _filled_dotenv()
    assert f":{dotenv['REDIS_PASSWORD']}@" in cfg.state.url
    assert f":{dotenv['POSTGRES_PASSWORD']}@" in cfg.database.url
    assert compose_interpolate(services["postgres"]["environment"]["POSTGRES_PASSWORD"],
                               dotenv) == dotenv["POSTGRES_PASSWORD"]
    assert compose_interpolate(services["redis"]["environment"]["REDIS_PASSWORD"],
                               dotenv) == dotenv["REDIS_PASSWORD"]
    assert "$$REDIS_PASSWORD" in " ".join(services["redis"]["command"])


def test_the_replicas_trust_exactly_nginx(compose: dict[str, Any]) -> None:
    env = _gateway_env(compose)
    config = (DEPLOY / "compose" / "config.toml").read_text("utf-8")
    cfg = load_config(config, env)
    nginx_address = compose["services"]["nginx"]["networks"]["tollhouse"]["ipv4_address"]
    assert cfg.server.trusted_proxies == [nginx_address]
    subnet = compose["networks"]["tollhouse"]["ipam"]["config"][0]["subnet"]
    assert ipaddress.ip_address(nginx_address) in ipaddress.ip_network(subnet)
    assert compose["services"]["gateway"]["networks"] == ["tollhouse"]


def test_stopping_leaves_the_drain_its_time(compose: dict[str, Any]) -> None:
    cfg = load_config((DEPLOY / "compose" / "config.toml").read_text("utf-8"),
                      _gateway_env(compose))
    grace = compose["services"]["gateway"]["stop_grace_period"]
    assert grace.endswith("s")
    assert float(grace[:-1]) >= cfg.server.shutdown_grace_s + 10


def test_secrets_come_from_the_environment_only(compose: dict[str, Any]) -> None:
    required: set[str] = set()
    for service in compose["services"].values():
        for key, value in (service.get("environment") or {}).items():
            value = str(value)
            if SECRET_NAME.search(key) or re.search(r"://[^/]*:[^/]*@", value):
                variables = compose_variables(value)
                assert variables, f"{key} holds a literal secret"
                # required: a missing one stops compose instead of starting with ""
                for name, op in variables:
                    if SECRET_NAME.search(name):
                        assert op == ":?", f"{name} in {key} is not ${{{name}:?...}}"
                        required.add(name)
    for text in _strings(compose):
        for name, op in compose_variables(text):
            if op == ":?":
                required.add(name)
    example = _dotenv_example()
    assert required <= set(example), f"missing from .env.example: {required - set(example)}"
    for name in required:
        if SECRET_NAME.search(name):
            assert example[name] == "", f".env.example gives {name} a value"
    assert ".env" in (DEPLOY / ".gitignore").read_text("utf-8").split()
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        compose_interpolate(compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"],
                            {})


def test_every_service_has_a_healthcheck_and_traffic_waits_for_ready(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    # the replicas are healthy when ready (database, Redis, migrations), not only alive
    assert "/readyz" in " ".join(services["gateway"]["healthcheck"]["test"])
    assert "urllib" in " ".join(services["gateway"]["healthcheck"]["test"])
    assert services["nginx"]["depends_on"] == {"gateway": {"condition": "service_healthy"}}
    assert services["gateway"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"}, "redis": {"condition": "service_healthy"}}
    assert "/nginx-health" in " ".join(services["nginx"]["healthcheck"]["test"])


# -- nginx ---------------------------------------------------------------------------------------

@dataclass
class Block:
    name: str
    args: list[str]
    directives: list[tuple[str, list[str]]] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)

    def get(self, name: str) -> list[str]:
        found = [args for key, args in self.directives if key == name]
        assert len(found) == 1, f"{name}: {found}"
        return found[0]

    def block(self, name: str, *args: str) -> Block:
        found = [b for b in self.blocks if b.name == name and tuple(b.args) == args]
        assert len(found) == 1, f"{name} {args}: {len(found)}"
        return found[0]


def parse_nginx(text: str) -> Block:
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|#[^\n]*|[{};]|[^\s{};]+', text)
    root = Block("main", [])
    stack = [root]
    words: list[str] = []
    for token in tokens:
        if token.startswith("#"):
            continue
        if token == ";":
            stack[-1].directives.append((words[0], words[1:]))
            words = []
        elif token == "{":
            block = Block(words[0], words[1:])
            stack[-1].blocks.append(block)
            stack.append(block)
            words = []
        elif token == "}":
            stack.pop()
        else:
            words.append(token[1:-1] if token[0] in "\"'" else token)
    assert len(stack) == 1 and not words, "unbalanced nginx config"
    return root


def _seconds(value: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(value[:-1]) * units[value[-1]] if value[-1] in units else float(value) / 1000


def test_nginx_keeps_sse_streams_whole(compose: dict[str, Any]) -> None:
    http = parse_nginx((DEPLOY / "nginx" / "nginx.conf").read_text("utf-8")).block("http")
    location = http.block("server").block("location", "/")
    assert location.get("proxy_pass") == ["http://tollhouse"]
    assert location.get("proxy_http_version") == ["1.1"]
    assert location.get("proxy_buffering") == ["off"]
    assert location.get("proxy_request_buffering") == ["off"]
    assert location.get("proxy_cache") == ["off"]
    connection = [a for k, a in location.directives
                  if k == "proxy_set_header" and a[0] == "Connection"]
    assert connection == [["Connection", ""]]
    cfg = load_config((DEPLOY / "compose" / "config.toml").read_text("utf-8"),
                      _gateway_env(compose))
    # a stream outlives the longest call the upstream config allows
    longest = max(u.total_timeout_s for u in cfg.upstreams)
    assert _seconds(location.get("proxy_read_timeout")[0]) >= max(longest, 3600)
    assert _seconds(location.get("proxy_send_timeout")[0]) >= max(longest, 3600)
    assert ["X-Forwarded-For", "$proxy_add_x_forwarded_for"] in [
        a for k, a in location.directives if k == "proxy_set_header"]


def test_nginx_balances_over_the_compose_replicas(compose: dict[str, Any]) -> None:
    http = parse_nginx((DEPLOY / "nginx" / "nginx.conf").read_text("utf-8")).block("http")
    upstream = http.block("upstream", "tollhouse")
    servers = [args[0] for key, args in upstream.directives if key == "server"]
    port = load_config((DEPLOY / "compose" / "config.toml").read_text("utf-8"),
                       _gateway_env(compose)).server.port
    assert servers == [f"gateway:{port}"]  # one name, one address per replica
    nginx = compose["services"]["nginx"]
    listen = http.block("server").get("listen")
    assert nginx["ports"] == ["${TOLLHOUSE_HTTP_PORT:-8080}:" + listen[0]]
    assert "./nginx/nginx.conf:/etc/nginx/nginx.conf:ro" in nginx["volumes"]
    # /metrics is for scrapers on the compose network, not for the outside
    assert http.block("server").block("location", "=", "/metrics").get("return") == ["404"]


def test_the_nginx_reader_sees_a_buffered_config() -> None:
    buffered = parse_nginx("""http { server { location / {
        proxy_pass http://tollhouse; # comment ; {
        proxy_buffering on;
        proxy_set_header Connection "close";
    } } }""")
    location = buffered.block("http").block("server").block("location", "/")
    assert location.get("proxy_buffering") == ["on"]
    assert location.get("proxy_pass") == ["http://tollhouse"]
    assert ("proxy_set_header", ["Connection", "close"]) in location.directives
