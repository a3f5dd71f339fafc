import pytest

from proxy.mcp.sse import EventSplitter, event_data, with_data


def test_whole_events_across_chunk_boundaries() -> None:
    s = EventSplitter()
    assert s.feed(b"event: message\ndata: {\"a\"") == []
    assert s.feed(b":1}\n") == []
    assert s.feed(b"\nid: 2\ndata: x\n\nda") == [b'event: message\ndata: {"a":1}\n\n',
                                                 b"id: 2\ndata: x\n\n"]
    assert s.pending == b"da"


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_line_endings(sep: bytes) -> None:
    nl = sep[: len(sep) // 2]
    s = EventSplitter()
    event = b"data: one" + nl + b"data: two" + sep
    assert s.feed(event) == [event]
    assert event_data(event) == b"one\ntwo"


def test_event_without_data_and_size_cap() -> None:
    assert event_data(b"id: 5\nretry: 100\n\n") == b""
    s = EventSplitter(max_event_bytes=10)
    with pytest.raises(ValueError):
        s.feed(b"data: " + b"x" * 20)


# Found by the SSE fuzz target (tests/fuzz/fuzz_sse.py): the splitter knew five spellings of a
# blank line, so other mixes of line ends, legal in an event stream, ended events where a
# client does not, or not where it does.
@pytest.mark.parametrize(("stream", "events"), [
    # LF then a lone CR: a blank line, two events for a client, once one for the gateway
    (b"data: a\n\rdata: b\n\n", [b"data: a\n\r", b"data: b\n\n"]),
    # CRLF then a lone CR at the end of what has arrived: the client dispatches, and so must we
    (b"data: a\r\n\r", [b"data: a\r\n\r"]),
    # CR then CRLF: one boundary, not a CR-CR one that leaves the LF behind
    (b"data: a\r\r\ndata: b\r\r", [b"data: a\r\r\n", b"data: b\r\r"]),
])
def test_any_mix_of_line_ends_ends_an_event_where_a_client_does(
        stream: bytes, events: list[bytes]) -> None:
    s = EventSplitter()
    assert s.feed(stream) == events
    assert s.pending == b""


def test_a_cr_that_may_begin_a_crlf_waits_for_the_next_byte() -> None:
    s = EventSplitter()
    assert s.feed(b"data: a\r") == []
    assert s.feed(b"\n") == []
    assert s.feed(b"\r\n") == [b"data: a\r\n\r\n"]


def test_a_bare_data_line_is_a_data_field_with_an_empty_value() -> None:
    # the client's data is "\n{...}" here; the gateway read "{...}" and kept the line on rewrite
    event = b'data\ndata: {"a":1}\n\n'
    assert event_data(event) == b'\n{"a":1}'
    assert with_data(event, b'{"b":2}') == b'data: {"b":2}\n\n'
