import orjson
import pytest

from proxy import errors
from proxy.errors import GatewayError, render


def all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(all_subclasses(sub))
    return out


SEED_004_CODES = {-32700, -32600, -32602, -32601, -32020, -32022, -32000, -32800, -32003, -32603}


@pytest.mark.parametrize("cls", all_subclasses(GatewayError), ids=lambda c: c.__name__)
def test_every_error_renders_in_a_documented_shape(cls: type) -> None:
    if cls is errors.UpstreamHTTPError:
        exc = cls(404)
    elif cls is errors.HiddenTool:
        exc = cls("access: tool x hidden", "x")
        assert exc.wire_message == "Unknown tool: x"
    elif cls.__name__ in ("UpstreamNotConnected", "UpstreamNeedsReconnect"):
        exc = cls("github", "http://127.0.0.1:8080/connect/github")
        assert exc.wire_message.endswith("http://127.0.0.1:8080/connect/github")
        assert exc.audit_reason in ("upstream_not_connected", "upstream_needs_reconnect")
    elif cls.__name__ == "OAuthError":
        exc = cls("invalid_grant", "the code is invalid")
    elif cls is errors.ToolResultDenial:
        exc = cls("metering: no credits", "You are out of credits.", "gateway.metering.denied")
    elif cls is errors.LockedOut:
        exc = cls("auth: locked", 30)
    elif cls is errors.RateLimited:
        exc = cls("rate_limit: calls-per-user", 1.2)
        assert exc.headers["Retry-After"] == "2"
    elif issubclass(cls, errors.PolicyDenied):
        exc = cls("policy: rule")
    elif cls is errors.UpstreamRejected:  # the upstream's own code, beyond seed 004's list
        exc = cls({"code": -32021, "message": "missing capability"}, 400)
        assert render(exc, 9)[2] == (b'{"jsonrpc":"2.0","id":9,"error":'
                                     b'{"code":-32021,"message":"missing capability"}}')
        assert exc.audit_reason == "upstream error -32021"
        return
    else:
        exc = cls()
    status, headers, body = render(exc, request_id=9)
    obj = orjson.loads(body)
    assert headers["Content-Type"] == "application/json"
    if cls.surface == "plain":
        assert set(obj) == {"error"} and 400 <= status < 500
    elif cls.surface == "tool_result":
        result = obj["result"]
        assert status == 200 and obj["id"] == 9 and result["isError"] is True
        assert result["content"] == [{"type": "text", "text": "You are out of credits."}]
        structured = result["structuredContent"]
        assert set(structured) == {"error_id", "code", "message", "retryable", "trace_id",
                                   "details", "created_at"}
        assert structured["code"] in errors.TOOL_ERROR_CODES
        assert structured["retryable"] is errors.TOOL_ERROR_CODES[structured["code"]]
    elif cls.surface == "oauth":
        assert set(obj) == {"error", "error_description"} and status in (400, 401, 413, 429)
    elif not cls.with_id:  # no call to answer: an HTTP error whose JSON-RPC body has no id
        assert set(obj) == {"jsonrpc", "error"} and status == 502
        assert obj["error"]["code"] == -32000
    else:
        assert obj["jsonrpc"] == "2.0" and obj["id"] == 9
        assert obj["error"]["code"] in SEED_004_CODES
        assert isinstance(obj["error"]["message"], str) and obj["error"]["message"]
    assert cls.audit_status in ("denied", "error", "cancelled")


def test_seed_004_statuses() -> None:
    assert errors.UpstreamFailure.http_status == 200 and errors.UpstreamFailure.code == -32000
    assert errors.Cancelled.http_status == 200 and errors.Cancelled.code == -32800
    assert (errors.BodyTooLarge.http_status, errors.BodyTooLarge.code) == (413, -32600)
    assert (errors.ParseError.http_status, errors.ParseError.code) == (400, -32700)
    assert (errors.MethodNotFound.http_status, errors.MethodNotFound.code) == (404, -32601)
    assert render(errors.EndpointNotFound())[2] == b'{"error":"not found"}'
    assert render(errors.SessionNotFound())[2] == b'{"error":"session not found"}'


def test_upstream_http_error_names_status_only() -> None:
    exc = errors.UpstreamHTTPError(503)
    assert exc.wire_message == "upstream answered HTTP 503"
