"""`[audit]` retention and `[audit.chain]`'s checks, and the one reading of the chain's
signing key (an Ed25519 private key in PEM, inline or a file next to the config), shared by
the check and the gateway: a key that is missing, unreadable or of another kind is one line
naming the key, and its text is never echoed."""

from __future__ import annotations

import typing
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from proxy.config.errors import ConfigError

if typing.TYPE_CHECKING:
    from proxy.config.tables import ChainConfig, Config

_KEY = "audit.chain.signing_key"
_WANTED = ("set it to an Ed25519 private key in PEM, inline (e.g. "
           "\"${TOLLHOUSE_AUDIT_SIGNING_KEY}\") or as a file next to the config; "
           "`openssl genpkey -algorithm ed25519` makes one")
MAX_RETENTION_DAYS = 100 * 365


def check(cfg: Config, base_dir: Path) -> None:
    audit = cfg.audit
    if not 0 <= audit.retention_days <= MAX_RETENTION_DAYS:
        raise ConfigError(f"config: 'audit.retention_days' must be between 0 (keep forever) "
                          f"and {MAX_RETENTION_DAYS}")
    if not 1 <= audit.chain.checkpoint_every_s <= 86400:
        raise ConfigError("config: 'audit.chain.checkpoint_every_s' must be between 1 and "
                          "86400")
    if audit.chain.enabled:
        signing_key(audit.chain, base_dir)


def signing_key(chain: ChainConfig, base_dir: Path) -> Ed25519PrivateKey:
    """The chain's signing key, read and parsed; a ConfigError naming the key otherwise."""
    value = chain.signing_key.strip()
    if not value:
        raise ConfigError(f"config: '{_KEY}' is empty, and audit.chain is enabled: {_WANTED}")
    if "-----BEGIN" in value:
        pem, where = value, ""
    else:
        path = base_dir / value
        where = f" ({path})" if len(value) < 512 and "\n" not in value else ""
        try:
            pem = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or "not a readable text file"
            raise ConfigError(f"config: '{_KEY}'{where} cannot be read: {reason}: "
                              f"{_WANTED}") from None
    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError):  # the library's text names no key: ours does
        key = None
    except Exception:  # noqa: BLE001 - an unsupported algorithm, say: never its text
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"config: '{_KEY}'{where} is not an Ed25519 private key in PEM "
                          f"(unencrypted PKCS#8): {_WANTED}")
    return key
