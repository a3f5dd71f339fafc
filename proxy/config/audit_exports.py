"""`[[audit.exports]]`'s checks: each export's name, kind, URL (its scheme fits the kind),
format, and the keys only some kinds take (a Splunk HEC's token, a webhook's secret). A token,
a secret or a header value is never echoed: a message names the key, and the allowed values."""

from __future__ import annotations

import typing
from pathlib import Path
from urllib.parse import urlsplit

from proxy.config.errors import ConfigError
from proxy.config.values import check_name, one_of, positive, url

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config, ExportConfig

EXPORT_KINDS = ("syslog", "otlp", "splunk_hec", "webhook")
EXPORT_FORMATS = ("ocsf", "native")
SYSLOG_SCHEMES = ("tcp", "tls")
MIN_SECRET = 16  # a webhook's HMAC key, in characters


def check(cfg: Config) -> None:
    seen: set[str] = set()
    for i, export in enumerate(cfg.audit.exports):
        where = f"audit.exports[{i}]"
        check_name(export.name, where, seen, "export")
        one_of(export.kind, EXPORT_KINDS, f"{where}.kind")
        one_of(export.format, EXPORT_FORMATS, f"{where}.format")
        _address(export, where)
        _secrets(export, where)
        if not 0 <= export.facility <= 23:
            raise ConfigError(f"config: '{where}.facility' must be between 0 and 23")
        positive(export.max_backlog, f"{where}.max_backlog")
        if not 1 <= export.batch <= 10_000:
            raise ConfigError(f"config: '{where}.batch' must be between 1 and 10000")
        positive(export.timeout_s, f"{where}.timeout_s")
        positive(export.retry_max_s, f"{where}.retry_max_s")
        if export.ca_file and not Path(export.ca_file).is_file():
            raise ConfigError(f"config: '{where}.ca_file' is not a readable file")


def _address(export: ExportConfig, where: str) -> None:
    if export.kind != "syslog":
        url(export.url, f"{where}.url")
        if export.kind == "otlp" and not _otel_installed():
            raise ConfigError(f"config: '{where}.kind' is otlp, which needs the otel extra: "
                              "pip install 'tollhouse[otel]'")
        return
    try:
        parts = urlsplit(export.url)
        port = parts.port
    except ValueError:
        port = None
        parts = None
    if parts is None or parts.scheme not in SYSLOG_SCHEMES or not parts.hostname or not port:
        raise ConfigError(f"config: '{where}.url' must be tcp://host:port or tls://host:port "
                          "for a syslog export")
    if export.headers:
        raise ConfigError(f"config: '{where}.headers' is for the HTTP kinds (otlp, "
                          "splunk_hec, webhook), not syslog")


def _secrets(export: ExportConfig, where: str) -> None:
    """Never the value itself: a token or a secret."""
    if export.kind == "splunk_hec":
        if not export.token:
            raise ConfigError(f"config: '{where}.token' is required with kind = splunk_hec")
    elif export.token:
        raise ConfigError(f"config: '{where}.token' is for kind = splunk_hec only")
    if export.kind == "webhook":
        if len(export.secret) < MIN_SECRET:
            raise ConfigError(f"config: '{where}.secret' is required with kind = webhook: at "
                              f"least {MIN_SECRET} characters (use ${{ENV}})")
    elif export.secret:
        raise ConfigError(f"config: '{where}.secret' is for kind = webhook only")
    for name, value in export.headers.items():
        if not name or not name.isascii() or not name.replace("-", "").isalnum():
            raise ConfigError(f"config: '{where}.headers' has a header name that is not a "
                              "token (letters, digits, '-')")
        if any(c in value for c in "\r\n\x00"):
            raise ConfigError(f"config: '{where}.headers.{name}' holds a line break")


def _otel_installed() -> bool:
    """The OpenTelemetry SDK and its OTLP/HTTP exporter (the `tollhouse[otel]` extra)."""
    try:
        import opentelemetry.exporter.otlp.proto.http._log_exporter
        import opentelemetry.sdk._logs  # noqa: F401
    except ImportError:
        return False
    return True
