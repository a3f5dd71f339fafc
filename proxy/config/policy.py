"""`[policy]`: the Cedar policy files (globs relative to the config file), the token claims
policies may read as `principal.claims`, and whether the policies enforce or only shadow.
The policies themselves are read and validated by policies.cedar.load."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Literal

from proxy.config.errors import ConfigError

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config

POLICY_MODES = ("enforce", "shadow")
_CLAIM = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")


@dataclass(frozen=True)
class PolicyConfig:
    """`[policy]`: Cedar policies deciding tools/call, resources/read and prompts/get on
    the call itself, after the access rules (both must allow)."""

    files: tuple[str, ...] = ()  # Cedar policy files; globs relative to the config file
    claims: tuple[str, ...] = ()  # token claims exposed to policies as principal.claims
    mode: Literal["enforce", "shadow"] = "enforce"  # "shadow": evaluate and audit, never refuse


def check(cfg: Config) -> None:
    p = cfg.policy
    if p.mode not in POLICY_MODES:
        raise ConfigError("config: 'policy.mode' must be enforce or shadow")
    for i, pattern in enumerate(p.files):
        if not pattern.strip():
            raise ConfigError(f"config: 'policy.files[{i}]' must not be empty")
    for i, claim in enumerate(p.claims):
        if not _CLAIM.match(claim):
            raise ConfigError(f"config: 'policy.claims[{i}]' must be a claim name "
                              "(letters, digits, _ . : -)")
    if len(set(p.claims)) != len(p.claims):
        raise ConfigError("config: 'policy.claims' names a claim twice")
