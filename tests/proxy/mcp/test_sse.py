import random

import pytest

from proxy.mcp.sse import _BOUNDARY, EventSplitter, event_data, with_data


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


class Reference:
    """The plain splitter: every chunk joined to what is pending, the whole searched again."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf, events, start = self.pending + chunk, [], 0
        for match in _BOUNDARY.finditer(buf):
            events.append(buf[start:match.end()])
            start = match.end()
        self.pending = buf[start:]
        return events


def test_every_chunking_splits_as_the_plain_splitter_does() -> None:
    """However the bytes are cut (one at a time, in large pieces while an event is pending),
    the events and the bytes left are the plain splitter's, which searches everything pending
    again on every chunk; this one searches only the new bytes and the 3 before them."""
    rng = random.Random(21)
    ends = [b"\n", b"\r\n", b"\r"]
    blanks = [b"\n\n", b"\r\n\r\n", b"\r\r", b"\n\r\n", b"\r\n\n", b"\n\r"]
    stream = b"".join(
        b"id: %d%sdata: %s%s" % (i, rng.choice(ends), b"x" * rng.choice((0, 3, 20_000)),
                                rng.choice(blanks))
        for i in range(40)) + b"data: unfinished\r"
    for trial in range(30):
        splitter, reference, got, want, at = EventSplitter(), Reference(), [], [], 0
        while at < len(stream):
            size = rng.choice((1, 2, 3, 5, 64, 4096, 50_000))
            got += splitter.feed(stream[at:at + size])
            want += reference.feed(stream[at:at + size])
            at += size
        assert got == want and len(got) >= 40, trial
        assert splitter.pending == reference.pending == b"data: unfinished\r"
        assert splitter.pending_size == len(reference.pending)
        assert splitter.take() == reference.pending and splitter.pending == b""
