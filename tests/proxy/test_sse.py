import pytest

from proxy.mcp.sse import EventSplitter, event_data


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
