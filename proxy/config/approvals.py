"""`[[approvals]]` and `[approvals_webhook]`: which tool calls wait for a person's yes, who may
give it, how long the call waits and how long a yes can be used; and the signed webhook each
new approval is posted to. The `when` condition is a Cedar condition, parsed and validated by
policies.approvals when the chain is built (proxy.compiled)."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field

from proxy.config.errors import ConfigError
from proxy.config.values import url

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_APPROVER = re.compile(r"^(self|group:.+|user:.+)$")
MAX_WAIT_S = 600.0  # a call held longer than this would outlive most clients' timeouts
MAX_EXPIRES_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class ApprovalRule:
    """One `[[approvals]]` table: the calls it holds (endpoints, tool globs, a Cedar
    condition) and who may approve them."""

    name: str  # named in the audit record, the console and the API
    endpoints: list[str] = field(default_factory=list)  # empty: all
    tools: list[str] = field(default_factory=lambda: ["*"])  # glob patterns of tool names
    # a Cedar condition over the entities of [policy] (principal, resource, context); empty:
    # every call of the tools above
    when: str = ""
    # "self" (the caller confirms), "group:<group>", "user:<subject>"
    approvers: list[str] = field(default_factory=list)
    wait_s: float = 30.0  # how long the call itself waits for a decision
    expires_s: float = 3600.0  # how long an approval, once given (or while pending), lasts


@dataclass(frozen=True)
class ApprovalsWebhookConfig:
    """`[approvals_webhook]`: each new approval is POSTed here (JSON, with a link to the
    console page), signed as the metering webhook is (`X-Tollhouse-Signature`)."""

    url: str = ""  # empty: no webhook
    secret: str = ""  # HMAC-SHA256 key of the X-Tollhouse-Signature header
    timeout_ms: int = 2000  # one delivery attempt's limit (a failure is logged, not retried)


def check(cfg: Config) -> None:
    seen: set[str] = set()
    for i, rule in enumerate(cfg.approvals):
        where = f"approvals[{i}]"
        if not _NAME.match(rule.name):
            raise ConfigError(f"config: '{where}.name' must be 1-64 letters, digits, _ . -")
        if rule.name in seen:
            raise ConfigError(f"config: '{where}.name' {rule.name!r} is used twice")
        seen.add(rule.name)
        if not rule.approvers:
            raise ConfigError(f"config: '{where}.approvers' must name at least one approver")
        for j, approver in enumerate(rule.approvers):
            if not _APPROVER.match(approver):
                raise ConfigError(f"config: '{where}.approvers[{j}]' must be \"self\", "
                                  "\"group:<group>\" or \"user:<subject>\"")
        if not rule.tools or any(not t.strip() for t in rule.tools):
            raise ConfigError(f"config: '{where}.tools' must name at least one pattern")
        if not 0 < rule.wait_s <= MAX_WAIT_S:
            raise ConfigError(f"config: '{where}.wait_s' must be above 0 and at most "
                              f"{MAX_WAIT_S:g}")
        if not 0 < rule.expires_s <= MAX_EXPIRES_S:
            raise ConfigError(f"config: '{where}.expires_s' must be above 0 and at most "
                              f"{MAX_EXPIRES_S:g}")
    hook = cfg.approvals_webhook
    if hook.url:
        url(hook.url, "approvals_webhook.url")
        if not hook.secret:
            raise ConfigError("config: 'approvals_webhook.secret' is required with "
                              "approvals_webhook.url")
    if not 0 < hook.timeout_ms <= 60_000:
        raise ConfigError("config: 'approvals_webhook.timeout_ms' must be 1 to 60000")
