"""`tollhouse serve` with a secret missing or malformed stops like any config error: one line on
stderr naming what is missing and how to set it, nothing on stdout, exit 2, and nothing written
first (no database file, no migration)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from proxy import cli
from proxy.config import ConfigError, from_dict
from proxy.oauth.keys import KeyRing

ROOT = Path(__file__).resolve().parents[2]  # this checkout, whatever the venv points at


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
