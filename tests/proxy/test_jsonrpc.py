import pytest

from proxy.errors import InvalidRequest, ParseError
from proxy.jsonrpc import parse, request_id_of, response_outcome


def test_request_notification_response() -> None:
    req = parse(b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo"}}')
    assert (req.kind, req.id, req.method, req.tool) == ("request", 7, "tools/call", "echo")
    note = parse(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert note.kind == "notification" and note.tool is None
    resp = parse(b'{"jsonrpc":"2.0","id":"s1","result":{}}')
    assert resp.kind == "response" and resp.id == "s1"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{nope", ParseError),
        (b"", ParseError),
        (b"\xff\xfe", ParseError),
        (b"[]", InvalidRequest),
        (b"7", ParseError),
        (b"null", ParseError),
        (b'{"a":1}', ParseError),
        (b'{"jsonrpc":2.0,"id":1,"method":"ping"}', ParseError),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', InvalidRequest),
        (b'"text"', ParseError),
        (b'{"id":1,"method":"ping"}', ParseError),
        (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', ParseError),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', InvalidRequest),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', InvalidRequest),
        (b'{"jsonrpc":"2.0","id":1,"method":7}', InvalidRequest),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}', InvalidRequest),
        (b'{"jsonrpc":"2.0","id":1}', InvalidRequest),
        (b'{"jsonrpc":"2.0","id":1,"result":{},"error":{}}', InvalidRequest),
    ],
)
def test_bad_messages(body: bytes, error: type) -> None:
    with pytest.raises(error):
        parse(body)


def test_request_id_of_is_best_effort() -> None:
    assert request_id_of(b'{"id":3}') == 3
    assert request_id_of(b'{"id":[1]}') is None
    assert request_id_of(b"nope") is None


def test_response_outcome() -> None:
    assert response_outcome({"jsonrpc": "2.0", "id": 1, "result": {}}, 1) == (True, None)
    assert response_outcome({"id": 1, "error": {"code": -32602}}, 1) == (
        False, "upstream error -32602")
    assert response_outcome({"id": 2, "result": {}}, 1) is None
    assert response_outcome({"method": "notifications/progress"}, 1) is None
    assert response_outcome([1], 1) is None


def test_a_response_is_what_a_client_takes_for_one() -> None:
    # found by the relay fuzz target (tests/fuzz/fuzz_relay.py): the gateway took these for the
    # answer to request 1 and relayed them, and the client, which does not, got no answer
    assert response_outcome({"jsonrpc": "2.0", "id": True, "result": {}}, 1) is None
    assert response_outcome({"jsonrpc": "2.0", "id": 1.0, "result": {}}, 1) is None
    assert response_outcome({"jsonrpc": "2.0", "id": 1, "erroror": {}}, 1) is None
    assert response_outcome({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, 1) is None
    assert response_outcome({"jsonrpc": "2.0", "id": "1", "result": {}}, 1) is None
    assert response_outcome({"jsonrpc": "2.0", "id": "1", "result": {}}, "1") == (True, None)
