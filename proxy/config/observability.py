"""`[observability]`'s checks: the log format, the service name, the OTLP endpoint (which
needs the otel extra) and the metrics token (a secret, never echoed)."""

from __future__ import annotations

import re
import typing

from proxy.config.errors import ConfigError
from proxy.config.values import url

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config

LOG_FORMATS = ("text", "json")
_SERVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check(cfg: Config) -> None:
    o = cfg.observability
    if o.log_format not in LOG_FORMATS:
        raise ConfigError(f"config: 'observability.log_format' must be one of "
                          f"{', '.join(LOG_FORMATS)}")
    if not _SERVICE_NAME.match(o.service_name):
        raise ConfigError("config: 'observability.service_name' must be 1-64 letters, digits, "
                          "'-', '_' or '.'")
    if o.otlp_endpoint:
        url(o.otlp_endpoint, "observability.otlp_endpoint")
        if not _otel_installed():
            raise ConfigError("config: 'observability.otlp_endpoint' is set, and tracing needs "
                              "the otel extra: pip install 'tollhouse[otel]'")
    if o.metrics_token and (len(o.metrics_token) < 16 or not o.metrics_token.isprintable()
                            or " " in o.metrics_token):
        # never the value itself: it is a secret
        raise ConfigError("config: 'observability.metrics_token' must be at least 16 "
                          "printable characters without spaces")


def _otel_installed() -> bool:
    """The OpenTelemetry SDK and its OTLP/HTTP exporter (the `tollhouse[otel]` extra)."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True
