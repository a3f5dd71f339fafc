"""`tollhouse serve` with a secret missing or malformed stops like any config error: one line on
stderr naming what is missing and how to set it, nothing on stdout, exit 2, and nothing written
first (no database file, no migration)."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp import types

from proxy import confine
from proxy.config import ConfigError, from_dict
from proxy.oauth.keys import KeyRing
from proxy.runtime import cli
from tests import helpers, state_backends
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import UpstreamProbe, stateless_json_app
from tests.helpers import DEADLINE_S, until
from tests.replicas.harness import toml
from tests.servers import serve

ROOT = Path(__file__).resolve().parents[3]  # this checkout, whatever the venv points at


def _private_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _public_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _config(tmp_path: Path, *, upstream: str = "", auth: str = "", extra: str = "") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f"""
[server]
listen = "127.0.0.1:0"
public_url = "http://127.0.0.1:8080"
[auth]
mode = "jwt"
{auth}
[database]
url = "sqlite:///{tmp_path / 't.db'}"
{extra}
[[upstreams]]
name = "a"
url = "http://127.0.0.1:9/mcp"
{upstream}
""")
    return path


OAUTH = '[oauth_server]\nenabled = true'
PER_USER = ('auth = "per_user"\n[upstreams.oauth]\nclient_id = "x"\n'
            'authorization_endpoint = "http://127.0.0.1:9/a"\n'
            'token_endpoint = "http://127.0.0.1:9/t"')
IDENTITY = 'identity = "jwt"'
ISSUER = ('[[auth.issuers]]\nissuer = "https://idp.example/"\npublic_key_pem = "${IDP_KEY}"\n'
          'algorithms = ["ES256"]')

# (config sections, environment, what the one line must say)
CASES: dict[str, tuple[dict[str, str], dict[str, str], list[str]]] = {
    "oauth server without TOLLHOUSE_SECRET_KEY": (
        {"extra": OAUTH}, {}, ["oauth_server.enabled", "TOLLHOUSE_SECRET_KEY", "set it"]),
    "per_user upstream without vault keys": (
        {"upstream": PER_USER}, {},
        ["per_user", "TOLLHOUSE_VAULT_KEYS", "TOLLHOUSE_SECRET_KEY", "set TOLLHOUSE_VAULT_KEYS"]),
    "vault key not base64": (
        {"upstream": PER_USER}, {"TOLLHOUSE_VAULT_KEYS": "k1=not-base64-SECRETVALUE!"},
        ["TOLLHOUSE_VAULT_KEYS", "'k1'", "not base64", "set TOLLHOUSE_VAULT_KEYS"]),
    "vault key of the wrong length": (
        {"upstream": PER_USER},
        {"TOLLHOUSE_VAULT_KEYS": "k1=" + base64.b64encode(b"SECRETVALUE12345").decode()},
        ["TOLLHOUSE_VAULT_KEYS", "'k1'", "16 bytes, not 32"]),
    "identity signing key that is no PEM": (
        {"upstream": IDENTITY, "auth": 'signing_key_pem = "${SIGNING_KEY}"'},
        {"SIGNING_KEY": "-----BEGIN PRIVATE KEY-----SECRETVALUE"},
        ["'auth.signing_key_pem'", "EC P-256 private key", "set it"]),
    "identity signing key that is RSA": (
        {"upstream": IDENTITY, "auth": 'signing_key_pem = "${SIGNING_KEY}"'},
        {"SIGNING_KEY": _private_pem(rsa.generate_private_key(65537, 2048))},
        ["'auth.signing_key_pem'", "EC P-256 private key"]),
    "identity signing key file that does not exist": (
        {"upstream": IDENTITY, "auth": 'signing_key_pem = "missing.pem"'}, {},
        ["'auth.signing_key_pem'", "cannot be read", "set it"]),
    "issuer public key that is no PEM": (
        {"auth": ISSUER}, {"IDP_KEY": "-----BEGIN PUBLIC KEY-----SECRETVALUE"},
        ["'auth.issuers[0].public_key_pem'", "public key", "set it"]),
}


def _serve(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(tmp_path / "c.toml")],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env})


def _refused_in_one_line(result: subprocess.CompletedProcess[str], says: list[str]) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stderr.endswith("\n"), result.stderr
    assert lines[0].startswith("tollhouse: config: "), lines[0]
    for fragment in says:
        assert fragment in lines[0], lines[0]
    assert "SECRETVALUE" not in result.stderr  # a secret's value is never shown


@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_or_malformed_secret_stops_serve_in_one_line(tmp_path: Path,
                                                               case: str) -> None:
    sections, env, says = CASES[case]
    _config(tmp_path, **sections)
    result = _serve(tmp_path, env)
    _refused_in_one_line(result, says)
    assert sorted(os.listdir(tmp_path)) == ["c.toml"]  # no database file: nothing migrated


def test_a_secret_that_does_not_open_the_stored_signing_keys(tmp_path: Path) -> None:
    """Only the database can tell that TOLLHOUSE_SECRET_KEY changed: still one line, exit 2."""
    _config(tmp_path, extra=OAUTH)
    KeyRing(f"sqlite:///{tmp_path / 't.db'}", "the-first-secret", 3600, 300)._db.close()
    result = _serve(tmp_path, {"TOLLHOUSE_SECRET_KEY": "SECRETVALUE-another"})
    _refused_in_one_line(result, ["TOLLHOUSE_SECRET_KEY", "does not open", "set it"])


def test_good_secrets_pass_the_check(tmp_path: Path) -> None:
    signing = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "signing.pem").write_text(_private_pem(signing))
    raw = {"auth": {"mode": "jwt", "signing_key_pem": "signing.pem",
                    "issuers": [{"issuer": "https://idp.example/",
                                 "public_key_pem": _public_pem(signing),
                                 "algorithms": ["ES256"]}]},
           "oauth_server": {"enabled": True},
           "upstreams": [{"name": "a", "url": "http://127.0.0.1:9/mcp", "identity": "jwt",
                          "auth": "per_user",
                          "oauth": {"client_id": "x",
                                    "authorization_endpoint": "http://127.0.0.1:9/a",
                                    "token_endpoint": "http://127.0.0.1:9/t"}}]}
    cfg = from_dict(raw, env={}, base_dir=tmp_path)
    vault = "k2=" + base64.b64encode(os.urandom(32)).decode()
    cli._check_secrets(cfg, tmp_path, {"TOLLHOUSE_SECRET_KEY": "s", "TOLLHOUSE_VAULT_KEYS": vault})
    cli._check_secrets(cfg, tmp_path, {"TOLLHOUSE_SECRET_KEY": "s"})  # the vault key derived
    with pytest.raises(ConfigError, match="oauth_server.enabled needs TOLLHOUSE_SECRET_KEY"):
        cli._check_secrets(cfg, tmp_path, {})


# ---------------------------------------------------------------------------------------------
# Once serve runs, the secrets it read are out of its process environment (issue 36, finding
# 4): a process it starts inherits none, and code in it finds none in os.environ. An in-process
# metering hook (tests/proxy/runtime/environ_hook.py) reports both, from the gateway itself (and from
# each worker with server.workers = 2).

HOOK = "tests.proxy.runtime.environ_hook:HOOK"
STARTED = re.compile(r"Running on http://127\.0\.0\.1:(\d+)"
                     r"|tollhouse listening on 127\.0\.0\.1:(\d+) with \d+ workers")
PROCESS_S = 3 * DEADLINE_S  # an interpreter starting on a loaded machine
# what serve is started with: its own secret, and values the config names as ${VAR}
SECRETS = {"TOLLHOUSE_SECRET_KEY": "SECRETVALUE-oauth-7d2e", "IDP_SECRET": helpers.SECRET,
           "UPSTREAM_KEY": "SECRETVALUE-upstream-91fa", "LATER_KEY": "SECRETVALUE-later-0c4b"}


@dataclass
class Gateway:
    """A running `tollhouse serve`, its stderr lines collected as they come."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    url: str = ""

    def said(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    async def read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))


def _serving_config(tmp_path: Path, upstream: str, workers: int, *, later: bool = False) -> Path:
    """serve behind a jwt issuer whose key is ${IDP_SECRET}, with the OAuth server (its signing
    keys sealed under TOLLHOUSE_SECRET_KEY) and an upstream sent ${UPSTREAM_KEY} (and, `later`,
    ${LATER_KEY} too), metered by the environment hook."""
    headers = {"X-Upstream-Key": "${UPSTREAM_KEY}",
               **({"X-Later-Key": "${LATER_KEY}"} if later else {})}
    state = {"url": state_backends.REDIS_URL, "key_prefix": state_backends.fresh_prefix()} \
        if workers > 1 else {"url": "memory"}
    path = tmp_path / "c.toml"
    path.write_text(toml({
        "server": {"listen": "127.0.0.1:0", "public_url": "http://127.0.0.1:8080",
                   "workers": workers},
        "auth": {"mode": "jwt", "issuers": [{"issuer": helpers.ISSUER,
                                             "hs256_secret": "${IDP_SECRET}",
                                             "algorithms": ["HS256"]}]},
        "database": {"url": f"sqlite:///{tmp_path / 't.db'}"}, "state": state,
        "oauth_server": {"enabled": True},
        "metering": {"hook": HOOK, "timeout_ms": int(PROCESS_S * 1000)},
        "upstreams": [{"name": "up", "url": upstream, "headers": headers}]}))
    return path


@asynccontextmanager
async def _gateway(config: Path, workers: int) -> AsyncIterator[Gateway]:
    """`tollhouse serve` on `config` with SECRETS in its environment, until it serves (with
    every worker); stopped with SIGTERM afterwards."""
    KeyRing(f"sqlite:///{config.parent / 't.db'}", SECRETS["TOLLHOUSE_SECRET_KEY"], 3600,
            300)._db.close()  # signing keys only the right TOLLHOUSE_SECRET_KEY opens
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), cwd=config.parent,
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **SECRETS})
    gw = Gateway(proc)
    reader = asyncio.create_task(gw.read())
    try:
        await until(lambda: any(STARTED.search(line) for line in gw.lines) or reader.done(),
                    PROCESS_S, what="serve to listen")
        match = next((m for m in map(STARTED.search, gw.lines) if m), None)
        assert match, "\n".join(gw.lines)
        gw.url = f"http://127.0.0.1:{match.group(1) or match.group(2)}/mcp/up"
        if workers > 1:
            await until(lambda: gw.said(") serving") >= workers, PROCESS_S,
                        what="every worker serving")
        yield gw
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), PROCESS_S)
        await asyncio.wait_for(reader, PROCESS_S)


async def _environment(gw: Gateway) -> dict[str, Any]:
    """What the hook reports from the process that took the call: its os.environ, and what a
    process it starts inherits."""
    async with connect(gw.url, headers={"Authorization": f"Bearer {helpers.token(endpoint='up')}"}
                       ) as client:
        denied = await client.call_tool("boom", {})
    assert denied.is_error
    content = denied.content[0]
    assert isinstance(content, types.TextContent)
    report: dict[str, Any] = orjson.loads(content.text)
    return report


def _holds_none(report: dict[str, Any], names: set[str]) -> None:
    """Neither the gateway's os.environ nor a child's holds `names`, or their values under
    another name; the process's own variables stay."""
    for where in ("environ", "child"):
        assert not names & set(report[where]), (where, report[where])
        assert "PATH" in report[where]
    assert not names & set(report["marked"]), report["marked"]


async def _upstream_key(gw: Gateway, probe: UpstreamProbe) -> dict[str, str]:
    """The secrets the upstream got with an `echo` through the gateway."""
    async with connect(gw.url, headers={"Authorization": f"Bearer {helpers.token(endpoint='up')}"}
                       ) as client:
        assert not (await client.call_tool("echo", {"text": "hi"})).is_error
    headers = probe.tool_calls("echo")[-1].headers
    return {k: v for k, v in headers.items() if k in ("x-upstream-key", "x-later-key")}


@pytest.mark.parametrize("workers", [1, 2])
async def test_the_secrets_serve_read_leave_its_environment(tmp_path: Path,
                                                           workers: int) -> None:
    """TOLLHOUSE_SECRET_KEY and every ${VAR} the config read are gone from os.environ (and so
    from what the gateway starts), while they still work: the OAuth server's signing keys open
    (the process serves), tokens of the ${IDP_SECRET} issuer pass, the upstream gets
    ${UPSTREAM_KEY}. With workers, in each worker too. A TOLLHOUSE_* or ${VAR} not read stays
    private all the same: LATER_KEY, named by no key, is not read and stays."""
    app, probe = stateless_json_app()
    async with serve(app) as base:
        config = _serving_config(tmp_path, f"{base}/mcp", workers)
        async with _gateway(config, workers) as gw:
            assert await _upstream_key(gw, probe) == {"x-upstream-key": SECRETS["UPSTREAM_KEY"]}
            report = await _environment(gw)
    _holds_none(report, {"TOLLHOUSE_SECRET_KEY", "IDP_SECRET", "UPSTREAM_KEY"})
    assert report["marked"] == ["LATER_KEY"]  # read by nothing: it stays


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_reload_reads_the_environment_serve_started_with(tmp_path: Path,
                                                                 workers: int) -> None:
    """SIGHUP re-reads the file against the private copy: a ${VAR} already out of os.environ
    still resolves, and one named for the first time (LATER_KEY) resolves and then leaves
    os.environ too."""
    app, probe = stateless_json_app()
    async with serve(app) as base:
        config = _serving_config(tmp_path, f"{base}/mcp", workers)
        async with _gateway(config, workers) as gw:
            assert await _upstream_key(gw, probe) == {"x-upstream-key": SECRETS["UPSTREAM_KEY"]}
            _serving_config(tmp_path, f"{base}/mcp", workers, later=True)
            gw.proc.send_signal(signal.SIGHUP)
            await until(lambda: gw.said("config reloaded from") >= workers, PROCESS_S,
                        what="every process to reload")
            assert not gw.said("refused"), "\n".join(gw.lines)
            assert await _upstream_key(gw, probe) == {"x-upstream-key": SECRETS["UPSTREAM_KEY"],
                                                      "x-later-key": SECRETS["LATER_KEY"]}
            report = await _environment(gw)
    _holds_none(report, {"TOLLHOUSE_SECRET_KEY", "IDP_SECRET", "UPSTREAM_KEY", "LATER_KEY"})
    assert report["marked"] == []


def test_what_leaves_the_environment_and_what_stays(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """Every variable a ${VAR} read and every TOLLHOUSE_* one leave os.environ; the process's
    own stay even when the config names them, and one nothing read stays."""
    for name in [n for n in os.environ if n.startswith("TOLLHOUSE_")]:  # (the suite's own)
        monkeypatch.delenv(name)  # back when the test ends, as is everything set below
    for name, value in {"UP_TOKEN": "t", "TOLLHOUSE_UNREAD": "u", "UNREAD": "v",
                        "HOME": str(tmp_path), "LC_ALL": "C.UTF-8"}.items():
        monkeypatch.setenv(name, value)
    env = confine.Environment(os.environ)
    cfg = from_dict({"upstreams": [{"name": "a", "url": "http://127.0.0.1:9/mcp", "headers": {
        "X-Token": "${UP_TOKEN}", "X-Home": "${HOME}", "X-Lc": "${LC_ALL}"}}]}, env=env)
    assert cfg.upstreams[0].headers["X-Token"] == "t"
    assert sorted(env.withdraw()) == ["TOLLHOUSE_UNREAD", "UP_TOKEN"]
    assert "UP_TOKEN" not in os.environ and "TOLLHOUSE_UNREAD" not in os.environ
    assert (os.environ["HOME"], os.environ["LC_ALL"], os.environ["UNREAD"]) == (
        str(tmp_path), "C.UTF-8", "v")
    assert env.copy()["UP_TOKEN"] == "t"  # the private copy keeps it, for reloads and workers
