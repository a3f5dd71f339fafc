"""The receivers an audit export is tested against, each a real server on a loopback port run
by the test: a syslog listener (TCP, or TLS with a certificate made here) that parses
octet-counted RFC 5424 frames, an OTLP/HTTP logs receiver that decodes the protobuf request, a
Splunk HEC-shaped endpoint, and a webhook that checks the signature. Each keeps what it
received in order (`events`: (event id, payload)), and can be taken down (`up = False`: the
HTTP ones answer 503, the syslog listener stops listening and drops its connections) and
brought back."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import ipaddress
import json
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

HEC_TOKEN = "hec-token-0123456789"
WEBHOOK_SECRET = "webhook-secret-0123456789"
# <PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD MSG (RFC 5424 section 6)
SYSLOG = re.compile(rb"^<(\d{1,3})>1 (\S+) (\S+) (\S+) (\S+) (\S+) (-|\[.*?\]) (.*)$", re.DOTALL)


@dataclass
class Received:
    """What a receiver took, in order; `changed` is set on each delivery."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refused: int = 0  # requests answered while down
    bad: list[str] = field(default_factory=list)  # anything malformed: the test fails on it
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    up: bool = True

    def ids(self) -> list[str]:
        return [eid for eid, _ in self.events]

    def take(self, eid: str, payload: dict[str, Any]) -> None:
        self.events.append((eid, payload))
        self.changed.set()


def event_id_of(payload: dict[str, Any]) -> str:
    """A payload's event id, OCSF (metadata.uid) or native (event_id)."""
    if "class_uid" in payload:
        return str(payload["metadata"]["uid"])
    return str(payload["event_id"])


# -- syslog -------------------------------------------------------------------------------------

class SyslogReceiver(Received):
    """A TCP (or TLS) listener reading octet-counted frames (`<length> <message>`), each an
    RFC 5424 message whose MSG is a JSON payload. `frames` keeps each message's header."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.headers: list[dict[str, Any]] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                  ssl=self._tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self.up = True

    async def stop(self) -> None:
        """No longer listening, every connection closed: a sender finds it refused."""
        self.up = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                length = await reader.readuntil(b" ")
                if not length[:-1].isdigit():
                    self.bad.append(f"not an octet count: {length!r}")
                    return
                self._message(await reader.readexactly(int(length[:-1])))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    def _message(self, message: bytes) -> None:
        match = SYSLOG.match(message)
        if match is None:
            self.bad.append(f"not RFC 5424: {message[:120]!r}")
            return
        pri, stamp, host, app, procid, msgid, sd, msg = match.groups()
        payload = json.loads(msg)
        self.headers.append({"pri": int(pri), "timestamp": stamp.decode(), "host": host.decode(),
                             "app": app.decode(), "procid": procid.decode(),
                             "msgid": msgid.decode(), "sd": sd.decode()})
        self.take(event_id_of(payload), payload)


def tls_pair(tmp: Path) -> tuple[ssl.SSLContext, Path]:
    """A server context for 127.0.0.1 with a certificate signed by a CA made here, and the
    CA's PEM file (what an export's ca_file names)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    return server, ca_file


# -- HTTP receivers (ASGI, served by tests.servers.serve) ---------------------------------------

async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def _answer(send: Any, status: int, body: bytes, kind: bytes = b"application/json"
                  ) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": body})


class _HttpReceiver(Received):
    path = "/"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await _body(receive)
        if not self.up:
            self.refused += 1
            return await _answer(send, 503, b"{}")
        if scope["path"] != self.path or scope["method"] != "POST":
            self.bad.append(f"{scope['method']} {scope['path']}")
            return await _answer(send, 404, b"{}")
        await self.handle(dict(scope["headers"]), body, send)

    async def handle(self, headers: dict[bytes, bytes], body: bytes, send: Any) -> None:
        raise NotImplementedError


class OtlpReceiver(_HttpReceiver):
    """POST /v1/logs, an ExportLogsServiceRequest (protobuf); each log record's body is the
    payload (a map, turned back into JSON values), its attribute tollhouse.event_id the id."""

    path = "/v1/logs"

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []  # each log record as protobuf's JSON

    async def handle(self, headers: dict[bytes, bytes], body: bytes, send: Any) -> None:
        if headers.get(b"content-type") != b"application/x-protobuf":
            self.bad.append(f"content-type {headers.get(b'content-type')!r}")
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_logs:
            for scope in resource.scope_logs:
                for record in scope.log_records:
                    as_json = MessageToDict(record)
                    self.records.append(as_json)
                    attributes = {a["key"]: _any(a["value"]) for a in as_json["attributes"]}
                    self.take(attributes["tollhouse.event_id"], _any(as_json["body"]))
        await _answer(send, 200, ExportLogsServiceResponse().SerializeToString(),
                      b"application/x-protobuf")


def _any(value: dict[str, Any]) -> Any:
    """An OTLP AnyValue (protobuf's JSON form) as a plain value."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "kvlistValue" in value:
        return {kv["key"]: _any(kv["value"]) for kv in value["kvlistValue"].get("values", [])}
    if "arrayValue" in value:
        return [_any(v) for v in value["arrayValue"].get("values", [])]
    return None


class HecReceiver(_HttpReceiver):
    """POST /services/collector/event with `Authorization: Splunk <token>`: concatenated
    event objects; answers HEC's {"text": "Success", "code": 0}."""

    path = "/services/collector/event"

    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[dict[str, Any]] = []

    async def handle(self, headers: dict[bytes, bytes], body: bytes, send: Any) -> None:
        if headers.get(b"authorization") != f"Splunk {HEC_TOKEN}".encode():
            self.bad.append("a request without the HEC token")
            return await _answer(send, 401, b'{"text":"Invalid token","code":4}')
        decoder, text, at = json.JSONDecoder(), body.decode(), 0
        while at < len(text):
            envelope, end = decoder.raw_decode(text, at)
            at = end
            while at < len(text) and text[at].isspace():
                at += 1
            self.envelopes.append(envelope)
            self.take(envelope["fields"]["event_id"], envelope["event"])
        await _answer(send, 200, b'{"text":"Success","code":0}')


class WebhookReceiver(_HttpReceiver):
    """POST / with `Tollhouse-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>." + body>`;
    a request whose signature does not hold is refused (401) and counted bad."""

    path = "/hook"

    async def handle(self, headers: dict[bytes, bytes], body: bytes, send: Any) -> None:
        signature = headers.get(b"tollhouse-signature", b"").decode()
        parts = dict(p.split("=", 1) for p in signature.split(",") if "=" in p)
        expected = hmac.new(WEBHOOK_SECRET.encode(), f"{parts.get('t')}.".encode() + body,
                            hashlib.sha256).hexdigest()
        if not hmac.compare_digest(parts.get("v1", ""), expected):
            self.bad.append("a bad signature")
            return await _answer(send, 401, b"{}")
        for payload in json.loads(body)["events"]:
            self.take(event_id_of(payload), payload)
        await _answer(send, 204, b"")
