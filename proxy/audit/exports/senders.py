"""How a batch of records reaches each kind of receiver: syslog (RFC 5424 messages over TCP
or TLS, octet-counted framing, RFC 6587 section 3.4.1), Splunk's HTTP Event Collector, and a
signed webhook; OTLP logs are `proxy.audit.exports.otlp`'s. A sender's `send` returns once the
receiver took the whole batch and raises otherwise (the worker retries the batch); the error
it raises never holds a token, a secret, a header value or the URL's query (`safe_error`).

Each record goes as its `payload` (proxy.audit.exports.event): the OCSF event or the native
record, both carrying the event id (OCSF `metadata.uid`, native `event_id`).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import os
import socket
import ssl
import time
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson

from proxy.audit.exports.event import Event, SendFailed
from proxy.config.tables import ExportConfig

SIGNATURE_HEADER = "Tollhouse-Signature"
HEC_PATH = "/services/collector/event"
APP_NAME = "tollhouse"
# syslog severities (RFC 5424): a refusal is a warning (4), an error an error (3), the rest
# informational (6)
_SYSLOG_SEVERITY = {"denied": 4, "error": 3}


class Sender(Protocol):
    async def send(self, events: list[Event]) -> None:
        """Deliver the batch, in order; raise unless the receiver took all of it."""

    async def close(self) -> None:
        """Let go of connections and threads."""


def tls_context(cfg: ExportConfig) -> ssl.SSLContext:
    """The context tls:// and https:// are verified with: the system's CAs, or `ca_file`'s."""
    return ssl.create_default_context(cafile=cfg.ca_file or None)


def safe_error(exc: BaseException, cfg: ExportConfig) -> str:
    """`exc` as one line for logs and the export's status: the URL's query and credentials,
    the token, the secret and every header value are masked."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    parts = urlsplit(cfg.url)
    hidden = [cfg.token, cfg.secret, *cfg.headers.values(), parts.query, parts.password or "",
              parts.username or ""]
    for value in hidden:
        if value and len(value) >= 3:
            text = text.replace(value, "***")
    return " ".join(text.split())[:500]


class SyslogSender:
    """RFC 5424 messages, one per record, each framed `<length> <message>` (octet counting),
    on one TCP or TLS connection kept open between batches. TCP has no answer: a batch is
    taken once it is written and flushed to the kernel; a connection the receiver closed is
    seen before the next batch and opened again."""

    def __init__(self, cfg: ExportConfig) -> None:
        parts = urlsplit(cfg.url)
        self._host = parts.hostname or ""
        self._port = parts.port or 6514
        self._tls = tls_context(cfg) if parts.scheme == "tls" else None
        self._facility = cfg.facility
        self._hostname = _syslog_name(socket.gethostname(), 255)
        self._procid = str(os.getpid())
        self._timeout_s = cfg.timeout_s
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def message(self, event: Event) -> bytes:
        """One RFC 5424 message: <PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID - MSG, the
        MSG the payload as JSON (UTF-8)."""
        status = str(event.record.get("status") or "")
        pri = self._facility * 8 + _SYSLOG_SEVERITY.get(status, 6)
        stamp = datetime.datetime.fromtimestamp(event.ts, datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ")
        head = f"<{pri}>1 {stamp} {self._hostname} {APP_NAME} {self._procid} audit - "
        return head.encode() + orjson.dumps(event.payload)

    async def send(self, events: list[Event]) -> None:
        reader, writer = await self._open()
        data = bytearray()
        for event in events:
            message = self.message(event)
            data += f"{len(message)} ".encode() + message
        try:
            writer.write(bytes(data))
            await writer.drain()
        except BaseException:
            await self.close()
            raise
        if reader.at_eof():  # closed while we wrote: what it read is unknown, send again
            await self.close()
            raise SendFailed("the syslog receiver closed the connection")

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        stream = self._stream
        if stream is not None and (stream[0].at_eof() or stream[1].is_closing()):
            await self.close()
            stream = None
        if stream is None:
            stream = await asyncio.open_connection(
                self._host, self._port, ssl=self._tls,
                server_hostname=self._host if self._tls is not None else None,
                ssl_handshake_timeout=self._timeout_s if self._tls is not None else None)
            self._stream = stream
        return stream

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream[1].close()
            try:
                await asyncio.wait_for(stream[1].wait_closed(), 1.0)
            except (OSError, TimeoutError, ssl.SSLError):
                pass


class _HttpSender:
    """A POST per batch on one pooled client; a 2xx answer takes the batch."""

    def __init__(self, cfg: ExportConfig, url: str) -> None:
        self._url = url
        self._headers = dict(cfg.headers)
        self._http = httpx.AsyncClient(verify=tls_context(cfg), timeout=cfg.timeout_s,
                                       follow_redirects=False, trust_env=False)

    async def _post(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        response = await self._http.post(self._url, content=body,
                                         headers={**self._headers, **headers})
        if not 200 <= response.status_code < 300:
            raise SendFailed(f"the receiver answered HTTP {response.status_code}")
        return response

    async def close(self) -> None:
        await self._http.aclose()


class HecSender(_HttpSender):
    """Splunk's HTTP Event Collector: one POST of the batch's events, each
    `{"time", "host", "source", "sourcetype", "fields": {"event_id"}, "event"}`, with
    `Authorization: Splunk <token>`; taken when HEC answers 200 with code 0."""

    def __init__(self, cfg: ExportConfig) -> None:
        parts = urlsplit(cfg.url)
        url = cfg.url if parts.path not in ("", "/") else urlunsplit(
            (parts.scheme, parts.netloc, HEC_PATH, parts.query, ""))
        super().__init__(cfg, url)
        self._auth = f"Splunk {cfg.token}"
        self._sourcetype = "ocsf:api_activity" if cfg.format == "ocsf" else "tollhouse:audit"
        self._host = socket.gethostname()

    async def send(self, events: list[Event]) -> None:
        body = b"\n".join(orjson.dumps({
            "time": round(e.ts, 6), "host": self._host, "source": APP_NAME,
            "sourcetype": self._sourcetype, "fields": {"event_id": e.event_id},
            "event": e.payload}) for e in events)
        response = await self._post(body, {"authorization": self._auth,
                                           "content-type": "application/json"})
        try:
            code = response.json().get("code")
        except (ValueError, AttributeError):
            raise SendFailed("the HEC answered with no JSON object") from None
        if code != 0:
            raise SendFailed(f"the HEC answered code {code}")


class WebhookSender(_HttpSender):
    """A JSON POST `{"events": [...]}` signed with `Tollhouse-Signature: t=<unix seconds>,
    v1=<hex HMAC-SHA256 of "<t>." followed by the body>`, keyed with the export's secret."""

    def __init__(self, cfg: ExportConfig) -> None:
        super().__init__(cfg, cfg.url)
        self._key = cfg.secret.encode()

    def sign(self, body: bytes, at: int) -> str:
        mac = hmac.new(self._key, f"{at}.".encode() + body, hashlib.sha256).hexdigest()
        return f"t={at},v1={mac}"

    async def send(self, events: list[Event]) -> None:
        body = orjson.dumps({"events": [e.payload for e in events]})
        await self._post(body, {"content-type": "application/json",
                                SIGNATURE_HEADER: self.sign(body, int(time.time()))})


def build(cfg: ExportConfig) -> Sender:
    """The sender of an export's kind."""
    if cfg.kind == "syslog":
        return SyslogSender(cfg)
    if cfg.kind == "splunk_hec":
        return HecSender(cfg)
    if cfg.kind == "webhook":
        return WebhookSender(cfg)
    from proxy.audit.exports.otlp import OtlpSender  # the otel extra: the config check

    return OtlpSender(cfg)


def _syslog_name(text: str, limit: int) -> str:
    """A HOSTNAME field: printable US-ASCII without spaces, else the nil value."""
    kept = "".join(c for c in text if 33 <= ord(c) <= 126)[:limit]
    return kept or "-"
