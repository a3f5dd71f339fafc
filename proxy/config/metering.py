"""`[metering]`'s checks: a hook or a signed webhook, and how a failure of either decides."""

from __future__ import annotations

import re
import typing

from proxy.config.errors import ConfigError
from proxy.config.values import positive, url

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config

_HOOK = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def check(cfg: Config) -> None:
    m = cfg.metering
    if m.hook and m.url:
        raise ConfigError("config: 'metering' takes hook or url, not both")
    if m.hook and not _HOOK.match(m.hook):
        raise ConfigError("config: 'metering.hook' must be module.path:object")
    if m.url:
        url(m.url, "metering.url")
        if not m.secret:
            raise ConfigError("config: 'metering.secret' is required with metering.url")
    if m.on_error not in ("deny", "allow"):
        raise ConfigError("config: 'metering.on_error' must be deny or allow")
    positive(m.timeout_ms, "metering.timeout_ms")
    positive(m.retry_max_s, "metering.retry_max_s")
    positive(m.keep_delivered_h, "metering.keep_delivered_h")
    if not m.methods:
        raise ConfigError("config: 'metering.methods' must name at least one method")
