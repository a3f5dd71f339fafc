"""`[[guardrails]]`, `[upstreams.screening]` and `[upstreams.pinning]`: the checks of where to
look for secrets and personal data, what to do with it, and how an upstream's definitions are
screened and pinned (policies/guardrails/ applies them)."""

from __future__ import annotations

import typing

import phonenumbers

from proxy.config.errors import ConfigError
from proxy.config.values import NAME, one_of, positive

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config, GuardrailRule

GUARDRAIL_DETECT = ("secrets", "card_numbers", "iban", "email", "phone", "entropy")


def check(cfg: Config) -> None:
    names: set[str] = set()
    known = {u.name for u in cfg.upstreams}
    for i, rule in enumerate(cfg.guardrails):
        _rule(rule, f"guardrails[{i}]", names, known)
    for up in cfg.upstreams:
        where = f"upstreams.{up.name}"
        one_of(up.screening.mode, ("off", "warn", "hide"), f"{where}.screening.mode")
        one_of(up.pinning.mode, ("off", "warn", "approve"), f"{where}.pinning.mode")
        positive(up.screening.max_description_chars, f"{where}.screening.max_description_chars")
        positive(up.screening.max_schema_bytes, f"{where}.screening.max_schema_bytes")


def _rule(rule: GuardrailRule, where: str, names: set[str], known: set[str]) -> None:
    if not NAME.match(rule.name) or rule.name in names:
        raise ConfigError(f"config: '{where}.name' must be 1-64 letters, digits, '-', '_' "
                          "or '.', and unique")
    names.add(rule.name)
    one_of(rule.action, ("redact", "deny", "audit"), f"{where}.action")
    if not rule.on or any(o not in ("arguments", "results") for o in rule.on):
        raise ConfigError(f"config: '{where}.on' must list arguments, results or both")
    if not rule.detect or any(d not in GUARDRAIL_DETECT for d in rule.detect):
        raise ConfigError(f"config: '{where}.detect' must list some of "
                          f"{', '.join(GUARDRAIL_DETECT)}")
    if not rule.tools:
        raise ConfigError(f"config: '{where}.tools' must not be empty (\"*\": every tool)")
    unknown = [e for e in rule.endpoints if e not in known]
    if unknown:
        raise ConfigError(f"config: '{where}.endpoints' names an unknown endpoint "
                          f"'{unknown[0]}'")
    if rule.phone_region not in phonenumbers.SUPPORTED_REGIONS:
        raise ConfigError(f"config: '{where}.phone_region' must be a two-letter region "
                          "code phonenumbers knows, such as US or DE")
