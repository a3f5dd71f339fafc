"""Every error class of every module renders, on every surface it can be raised on, in one of
seed 004's shapes, with its status, and without the secrets it may carry for the audit; and no
module outside proxy/errors builds an error body by hand."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

import policies
import proxy
from policies.approvals import TooManyPending
from policies.egress import EgressDenied
from proxy import errors
from proxy.approvals import ApprovalDenied
from proxy.config.template import Missing
from proxy.connect.guarded import EgressRefused
from proxy.connect.links import UrlElicitationRequired
from proxy.connect.manager import UpstreamNeedsReconnect, UpstreamNotConnected
from proxy.destinations import EgressDestinationDenied
from proxy.errors import SURFACES, GatewayError, Surface, render
from proxy.upstream.tenants import NoUpstreamForCaller

ROOT = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t-7f1e"  # stands for a token, a password or an address the wire must not show


def _import_every_module() -> None:
    for package in (proxy, policies):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name != "proxy.__main__":  # runs the CLI
                importlib.import_module(info.name)


def _subclasses(cls: type[GatewayError]) -> Iterator[type[GatewayError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


_import_every_module()
CLASSES = sorted({c for c in _subclasses(GatewayError)
                  if c.__module__.startswith(("proxy.", "policies."))} | {GatewayError},
                 key=lambda c: f"{c.__module__}.{c.__qualname__}")


class _Model(BaseModel):
    url: int


def _pydantic_error() -> ValidationError:
    try:
        _Model.model_validate({"url": "x"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


# one instance per class, carrying a secret wherever the class keeps one off the wire
def _approval(status: Any = "pending") -> Any:
    from proxy.state.approvals import Approval
    return Approval("apr_x", "r", "iss|bob", "bob", "up", "t", "d", "v", "b", ("group:g",),
                    1.0, 60.0, 0.0, 60.0, status=status, decided_by="alice", comment="no")


EXAMPLES: dict[type[GatewayError], Callable[[], GatewayError]] = {
    GatewayError: lambda: GatewayError(),
    errors.Unauthenticated: lambda: errors.Unauthenticated(f"auth: bad token {SECRET}"),
    errors.Forbidden: lambda: errors.Forbidden(f"auth: key {SECRET} not for this endpoint"),
    errors.LockedOut: lambda: errors.LockedOut(f"auth: locked {SECRET}", 30),
    errors.BodyTooLarge: lambda: errors.BodyTooLarge.over(65536),
    errors.StoreUnavailable: lambda: errors.StoreUnavailable("the code store is unavailable"),
    errors.DatabaseUnavailable: lambda: errors.DatabaseUnavailable(),
    errors.Draining: lambda: errors.Draining(),
    errors.InternalError: lambda: errors.InternalError(f"KeyError {SECRET}"),
    errors.EndpointNotFound: lambda: errors.EndpointNotFound(),
    errors.SessionNotFound: lambda: errors.SessionNotFound(),
    errors.MethodNotAllowed: lambda: errors.MethodNotAllowed(headers={"Allow": "POST"}),
    errors.OriginNotAllowed: lambda: errors.OriginNotAllowed(),
    errors.NotAcceptable: lambda: errors.NotAcceptable(),
    errors.UnsupportedMediaType: lambda: errors.UnsupportedMediaType(),
    errors.ParseError: lambda: errors.ParseError(),
    errors.InvalidRequest: lambda: errors.InvalidRequest(),
    errors.InvalidParams: lambda: errors.InvalidParams("params.name must be a string"),
    errors.MethodNotFound: lambda: errors.MethodNotFound(),
    errors.HeaderMismatch: lambda: errors.HeaderMismatch(),
    errors.UnsupportedVersion: lambda: errors.UnsupportedVersion(
        data={"supported": ["2025-11-25"], "requested": "1999-01-01"}),
    errors.InvalidEnvelope: lambda: errors.InvalidEnvelope(),
    errors.PolicyDenied: lambda: errors.PolicyDenied(f"policy: rule {SECRET}"),
    errors.HiddenTool: lambda: errors.HiddenTool(f"access: hidden {SECRET}", "x"),
    errors.PolicyBlocked: lambda: errors.PolicyBlocked(
        "cedar: forbidden by p1", "only the security team files security issues"),
    errors.GuardrailBlocked: lambda: errors.GuardrailBlocked(
        "guardrail g: secret in arguments", "Blocked by guardrail g: the arguments carry secret."),
    errors.RateLimited: lambda: errors.RateLimited(f"rate_limit: {SECRET}", 1.2),
    errors.GuardrailResultBlocked: lambda: errors.GuardrailResultBlocked(
        "guardrail strict: secret in result",
        "Blocked by guardrail 'strict': the result carries secret."),
    errors.MeteringDenied: lambda: errors.MeteringDenied("insufficient_credits"),
    errors.ToolResultDenial: lambda: errors.ToolResultDenial(
        f"metering: {SECRET}", "You are out of credits.", "gateway.metering.denied"),
    errors.ApprovalRequired: lambda: errors.ApprovalRequired(_approval(), "https://gw/a"),
    ApprovalDenied: lambda: ApprovalDenied(_approval("denied")),
    TooManyPending: lambda: TooManyPending(),
    errors.UpstreamFailure: lambda: errors.UpstreamFailure(),
    errors.UpstreamUnavailable: lambda: errors.UpstreamUnavailable(),
    errors.UpstreamTimeout: lambda: errors.UpstreamTimeout(),
    errors.UpstreamHTTPError: lambda: errors.UpstreamHTTPError(503),
    errors.UpstreamProtocolError: lambda: errors.UpstreamProtocolError(),
    errors.UpstreamStreamCut: lambda: errors.UpstreamStreamCut(),
    errors.ResponseTooLarge: lambda: errors.ResponseTooLarge(16 * 1024 * 1024),
    errors.UpstreamBadGateway: lambda: errors.UpstreamBadGateway(),
    errors.UpstreamRejected: lambda: errors.UpstreamRejected(
        {"code": -32021, "message": "missing capability"}, 400),
    errors.Cancelled: lambda: errors.Cancelled("cancelled by the client"),
    errors.BodyTimeout: lambda: errors.BodyTimeout(),
    errors.ApiError: lambda: errors.ApiError("a rule does not hold"),
    errors.BadRequest: lambda: errors.BadRequest("user 'a' signs in elsewhere"),
    errors.NotSignedIn: lambda: errors.NotSignedIn("invalid or expired credential",
                                                   headers={"WWW-Authenticate": "Bearer"}),
    errors.NotPermitted: lambda: errors.NotPermitted("administrators only"),
    errors.NotFound: lambda: errors.NotFound("server 'echo' not found"),
    errors.Conflict: lambda: errors.Conflict("user 'a' already exists"),
    errors.Invalid: lambda: errors.Invalid.from_pydantic(_pydantic_error()),
    errors.OAuthError: lambda: errors.OAuthError("invalid_grant", "code expired"),
    errors.NulCharacter: lambda: errors.NulCharacter("query"),
    errors.HTTPRefusal: lambda: errors.HTTPRefusal(405, "Method Not Allowed"),
    UpstreamNotConnected: lambda: UpstreamNotConnected("github", "http://gw/connect/github"),
    UpstreamNeedsReconnect: lambda: UpstreamNeedsReconnect("github", "http://gw/connect/github"),
    UrlElicitationRequired: lambda: UrlElicitationRequired(
        UpstreamNotConnected("github", "http://gw/connect/github"),
        {"mode": "url", "elicitationId": "e1", "url": "http://gw/connect/github?link=t",
         "message": "Connect your github account to Tollhouse to continue."}),
    EgressRefused: lambda: EgressRefused(),
    EgressDestinationDenied: lambda: EgressDestinationDenied(f"resolves to {SECRET}"),
    EgressDenied: lambda: EgressDenied(f"egress: POLICY_LAN_ONLY {SECRET}"),
    NoUpstreamForCaller: lambda: NoUpstreamForCaller(Missing("tenant", "invalid")),
}

SEED_004_CODES = {-32700, -32600, -32602, -32601, -32020, -32022, -32000, -32800, -32003, -32603}
STATUSES: dict[Surface, set[int]] = {  # seed 004's tables, and the edge's own refusals
    "mcp": {200, 400, 401, 403, 404, 405, 406, 408, 413, 415, 429, 500, 502, 503},
    "api": {400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 503},
    "oauth": {400, 401, 403, 404, 405, 413, 429, 500, 503},
}


def test_every_class_has_an_example() -> None:
    """A new error class fails here until it is added to EXAMPLES, and so rendered below."""
    assert set(CLASSES) == set(EXAMPLES), "add the new class to EXAMPLES"
    for cls, make in EXAMPLES.items():
        assert type(make()) is cls
        assert cls.surfaces and cls.surfaces <= set(SURFACES), cls
        assert cls.audit_status in ("denied", "error", "cancelled")


CASES = [(cls, surface) for cls in CLASSES for surface in SURFACES if surface in cls.surfaces]


@pytest.mark.parametrize(("cls", "surface"), CASES,
                         ids=[f"{c.__qualname__}-{s}" for c, s in CASES])
def test_every_error_renders_in_a_seed_004_shape(cls: type[GatewayError],
                                                 surface: Surface) -> None:
    exc = EXAMPLES[cls]()
    status, headers, body = render(exc, 9, surface=surface)
    assert status == exc.wire_status and status in STATUSES[surface]
    assert headers["Content-Type"] == "application/json"
    assert all(headers[k] == v for k, v in exc.headers.items())
    if surface != "mcp":
        assert headers["Cache-Control"] == "no-store"
    assert SECRET not in body.decode() and SECRET not in str(headers)
    SHAPES[cls.shape_on(surface)](exc, status, orjson.loads(body))


def _jsonrpc(exc: GatewayError, status: int, obj: dict[str, Any]) -> None:
    error = obj["error"]
    assert obj["jsonrpc"] == "2.0" and set(error) <= {"code", "message", "data"}
    assert isinstance(error["message"], str) and error["message"]
    if isinstance(exc, errors.UpstreamRejected):  # the upstream's own code, beyond seed 004's
        assert obj == {"jsonrpc": "2.0", "id": 9, "error": exc.error}
        return
    if isinstance(exc, UrlElicitationRequired):  # 2025-11-25's own code, beyond seed 004's
        assert error["code"] == -32042 and status == 200
        assert error["data"]["elicitations"][0]["mode"] == "url"
        return
    assert error["code"] == exc.code and error["code"] in SEED_004_CODES
    if exc.with_id:
        assert set(obj) == {"jsonrpc", "id", "error"} and obj["id"] == 9
    else:  # no call to answer: an HTTP error whose JSON-RPC body has no id
        assert set(obj) == {"jsonrpc", "error"} and status == 502
    if error["code"] in (-32000, -32800) and status != 200:  # seed 004: 200 after routing
        assert isinstance(exc, (errors.Unauthenticated, errors.Forbidden, errors.RateLimited,
                                errors.StoreUnavailable, errors.Draining,
                                errors.UpstreamBadGateway))


def _plain(exc: GatewayError, status: int, obj: dict[str, Any]) -> None:
    assert set(obj) == {"error"} and isinstance(obj["error"], str) and 400 <= status < 500


def _detail(exc: GatewayError, status: int, obj: dict[str, Any]) -> None:
    assert set(obj) == {"detail"} and isinstance(obj["detail"], str) and obj["detail"]


def _validation(exc: GatewayError, status: int, obj: dict[str, Any]) -> None:
    assert status == 422 and set(obj) == {"detail"} and obj["detail"]
    assert all(set(p) == {"loc", "msg", "type"} and isinstance(p["loc"], list)
               for p in obj["detail"])


def _oauth(exc: GatewayError, status: int, obj: dict[str, Any]) -> None:
    assert set(obj) == {"error", "error_description"}
    assert isinstance(obj["error"], str) and isinstance(obj["error_description"], str)


def _tool_result(exc: GatewayError, status: int, obj: dict[str, Any]) -> None:
    result = obj["result"]
    assert status == 200 and obj["id"] == 9 and result["isError"] is True
    assert isinstance(exc, errors.ToolResultDenial)
    assert result["content"] == [{"type": "text", "text": exc.wire_message}]
    structured = result["structuredContent"]
    assert set(structured) - {"retry_after_ms"} == {
        "error_id", "code", "message", "retryable", "trace_id", "details", "created_at"}
    assert structured["details"] == exc.details
    assert structured["retryable"] is errors.TOOL_ERROR_CODES[structured["code"]]


SHAPES = {"jsonrpc": _jsonrpc, "plain": _plain, "detail": _detail, "validation": _validation,
          "oauth": _oauth, "tool_result": _tool_result}


def test_seed_004_statuses() -> None:
    assert errors.UpstreamFailure.http_status == 200 and errors.UpstreamFailure.code == -32000
    assert errors.Cancelled.http_status == 200 and errors.Cancelled.code == -32800
    assert (errors.BodyTooLarge.http_status, errors.BodyTooLarge.code) == (413, -32600)
    assert (errors.ParseError.http_status, errors.ParseError.code) == (400, -32700)
    assert (errors.MethodNotFound.http_status, errors.MethodNotFound.code) == (404, -32601)
    assert render(errors.EndpointNotFound())[2] == b'{"error":"not found"}'
    assert render(errors.SessionNotFound())[2] == b'{"error":"session not found"}'
    assert render(errors.EndpointNotFound(), surface="oauth")[2] == b'{"error":"not found"}'


def test_seed_004_examples_on_each_surface() -> None:
    assert orjson.loads(render(errors.NotFound("server 'echo' not found"), surface="api")[2]) \
        == {"detail": "server 'echo' not found"}
    assert orjson.loads(render(errors.OAuthError("invalid_grant", "code expired"),
                               surface="oauth")[2]) \
        == {"error": "invalid_grant", "error_description": "code expired"}
    assert orjson.loads(render(errors.MeteringDenied("insufficient_credits"), 1)[2]) == {
        "jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "insufficient_credits"}}
    assert render(errors.BodyTooLarge.over(65536), surface="oauth")[:3:2] == (
        413, (b'{"error":"invalid_request",'
              b'"error_description":"request body exceeds the 65536-byte limit"}'))
    assert render(errors.BodyTooLarge(), None)[2] == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Request body too large"}}')


@pytest.mark.parametrize("surface", SURFACES)
def test_a_lockout_has_one_text_and_shape_everywhere(surface: Surface) -> None:
    status, headers, body = render(errors.LockedOut("auth: locked", 29.2), 1, surface=surface)
    assert (status, headers["Retry-After"]) == (429, "30")
    assert orjson.loads(body) == {"error": "too_many_requests", "error_description":
                                  "too many failed authentication attempts; try again later"}


@pytest.mark.parametrize("surface", SURFACES)
def test_store_unavailable_in_each_surfaces_shape(surface: Surface) -> None:
    status, headers, body = render(errors.StoreUnavailable("the code store is unavailable"),
                                   7, surface=surface)
    assert (status, headers["Retry-After"]) == (503, "1")
    assert orjson.loads(body) == {
        "mcp": {"jsonrpc": "2.0", "id": 7,
                "error": {"code": -32000, "message": "Resident runtime unavailable"}},
        "api": {"detail": "the code store is unavailable"},
        "oauth": {"error": "temporarily_unavailable",
                  "error_description": "the code store is unavailable"}}[surface]


def test_surface_of_a_quart_request() -> None:
    assert errors.surface_of("/api/v1/servers") == "api"
    assert errors.surface_of("/api/v1/me/connections") == "api"
    assert all(errors.surface_of(p) == "oauth"
               for p in ("/oauth/token", "/signin", "/.well-known/jwks.json", "/nowhere"))


def test_upstream_http_error_names_status_only() -> None:
    exc = errors.UpstreamHTTPError(503)
    assert exc.wire_message == "upstream answered HTTP 503"


# -- no error body built outside proxy/errors -----------------------------------------------------

ALLOWED = {
    # the management API's OpenAPI document describes the shapes as JSON Schema; it builds none
    "proxy/api/openapi.py",
}
BODY_TEXT = ('"error_description"', '{"error"', '{"detail"', '"jsonrpc":"2.0","id"')


def _literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Why a node of `tree` looks like an error body being built: a dict literal with an
    error shape's keys, or a string or bytes constant holding one (docstrings are skipped)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if "error_description" in keys or keys in ({"detail"}, {"error"}) \
                    or {"jsonrpc", "error"} <= keys:
                yield node.lineno, f"dict literal with keys {sorted(map(str, keys))}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) \
                and id(node) not in docstrings:
            text = node.value.decode("latin1") if isinstance(node.value, bytes) else node.value
            found = [b for b in BODY_TEXT if b in text.replace(" ", "")]
            if found:
                yield node.lineno, f"constant holding {found[0]}"


def test_no_error_body_is_built_outside_proxy_errors() -> None:
    offences = []
    for path in sorted([*ROOT.glob("proxy/**/*.py"), *ROOT.glob("policies/**/*.py")]):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith("proxy/errors/") or where in ALLOWED:
            continue
        offences += [f"{where}:{line}: {why}"
                     for line, why in _literals(ast.parse(path.read_text()))]
    assert offences == []


def test_the_literal_check_finds_hand_built_bodies() -> None:
    source = ('def f():\n    """A {"detail": ...} body, described."""\n'
              '    a = {"detail": "x"}\n    b = b\'{"error":"not found"}\'\n'
              '    c = {"jsonrpc": "2.0", "id": 1, "error": {}}\n'
              '    d = {"error": "e", "error_description": "d"}\n    e = {"items": []}\n')
    assert [line for line, _ in _literals(ast.parse(source))] == [3, 4, 5, 6]
