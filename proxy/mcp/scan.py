"""What a streamed answer says about its call, learned as its bytes pass through.

An answer no policy rewrites goes to the client as it arrives (`relay.py`), so the gateway never
holds it whole; it still needs the few facts the audit record and the metrics carry: the
JSON-RPC id, result or error (and the error's code), and a tool result's `isError`. `AnswerScan`
follows the JSON structure of one message chunk by chunk (strings skipped at C speed, only the
structural characters visited) and keeps just those values, each bounded by `CAPTURE_BYTES`,
wherever in the message they come: `isError` is usually the last key of a result.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_STRUCTURE = re.compile(rb'["{}\[\],:]')
_NESTING = re.compile(rb'["{}\[\]]')
_DEEP_RUN = re.compile(rb'(?:[^"{}\[\]]++|"(?:[^"\\]++|\\.)*+")*+', re.DOTALL)
_BLANK = re.compile(rb"[ \t\r\n]*")  # _SPACE
_STRING_BODY = re.compile(rb'(?:[^"\\]++|\\.)*+', re.DOTALL)  # up to the closing quote (or a lone \)
_SPACE = b" \t\r\n"
CAPTURE_BYTES = 4096  # past this a value is not kept (an error's data, an absurd id)
_KEY_BYTES = 64  # a key longer than this is none that is looked for
_KEPT = {(1, b"", b"id"), (1, b"", b"method"), (2, b"result", b"isError"),
         (2, b"error", b"code")}
_INSIDE = {b"result": b"isError", b"error": b"code"}  # what is kept from inside each


class AnswerScan:
    """Feed it a message's bytes in order; `message()` at the end is a stand-in for it with
    what was learned (`jsonrpc`, `id`, `result` or `error`, `method`, `result.isError`,
    `error.code`), for
    `response_outcome` to judge as it judges a whole message; `method()` is the method's
    name as soon as it has passed."""

    __slots__ = ("_cap", "_cap_depth", "_cap_name", "_cap_over", "_escape", "_in_string",
                 "_key", "_key_wanted", "_reading_key", "_stack", "_sub_key", "_top_key",
                 "bad", "done", "keys", "values")

    def __init__(self) -> None:
        self._stack = bytearray()  # one b"{" or b"[" per open container
        self._in_string = False
        self._escape = False  # a backslash ended the last chunk inside a string
        self._key_wanted = False  # the next string in this object is a key
        self._reading_key = False
        self._key = bytearray()
        self._top_key = b""
        self._sub_key = b""
        self._cap: bytearray | None = None  # the value being kept
        self._cap_name = b""
        self._cap_depth = 0
        self._cap_over = False
        self.keys: set[bytes] = set()  # the message's own keys
        self.values: dict[bytes, bytes | None] = {}  # raw JSON of id, isError, code
        self.done = False  # the message's closing brace has passed
        self.bad = False  # not one JSON object

    def feed(self, chunk: bytes) -> None:
        if self.done:  # only white space may follow the message
            self.bad = self.bad or bool(chunk.strip(_SPACE))
            return
        i, n, cap_from = 0, len(chunk), 0
        while i < n:
            if self._in_string:  # (`_escape`: the chunk's first byte is escaped)
                j = _STRING_BODY.match(chunk, i + self._escape).end()  # type: ignore[union-attr]
                closing = j < n and chunk[j] == 0x22
                if self._reading_key:  # a lone backslash at the end is the key's too
                    self._read_key(chunk[i:j if closing else n], closing)
                if closing:
                    self._in_string = self._escape = False
                    i = j + 1
                else:  # the string goes on in the next chunk (escaped: it ended in a backslash)
                    self._escape = j < n
                    i = n
                continue
            if not self._stack:  # before the message
                i = self._opening(chunk, i)
                continue
            if self._tracked():  # every structural character
                m = _STRUCTURE.search(chunk, i)
            else:  # whole strings and all between brackets skipped at once
                i = _DEEP_RUN.match(chunk, i).end()  # type: ignore[union-attr]
                m = _NESTING.search(chunk, i)
            if m is None:
                break
            at = m.start()
            c = chunk[at]
            i = at + 1
            if c == 0x22:  # " (where keys are tracked, the stack is b"{" or b"{{")
                self._in_string = True
                self._reading_key = self._key_wanted and self._tracked()
            elif c == 0x3A:  # : (searched for only where keys are tracked)
                self._key_wanted = False
                depth = len(self._stack)
                where = (1, b"", self._top_key) if depth == 1 else (2, self._top_key, self._sub_key)
                if where in _KEPT:
                    self._cap, self._cap_name, self._cap_depth = bytearray(), where[2], depth
                    cap_from = i
            elif c == 0x2C:  # ,
                if self._cap is not None and len(self._stack) == self._cap_depth:
                    self._end_capture(chunk, cap_from, at)
                self._key_wanted = self._stack[-1] == 0x7B
            elif c in (0x7B, 0x5B):  # { [
                self._stack.append(c)
                self._key_wanted = c == 0x7B
            else:  # } ]
                if self._cap is not None and len(self._stack) == self._cap_depth:
                    self._end_capture(chunk, cap_from, at)
                self._stack.pop()
                self._key_wanted = False
                if not self._stack:  # the message has ended: only white space may follow
                    self.done = True
                    self.bad = bool(chunk[i:].strip(_SPACE))
                    return
        if self._cap is not None:
            self._keep(chunk[cap_from:])

    def _opening(self, chunk: bytes, i: int) -> int:
        """Before the message: white space, then its opening brace; anything else first makes
        the scan bad (and done). Where the scan goes on: past the brace, or the chunk's end."""
        j = _BLANK.match(chunk, i).end()  # type: ignore[union-attr]
        if j == len(chunk):
            return j
        if chunk[j] != 0x7B:
            self.bad = self.done = True
            return len(chunk)
        self._stack.append(0x7B)
        self._key_wanted = True
        return j + 1

    def _tracked(self) -> bool:
        """Before the message, in its own object, or in its result or error object: where keys
        (and the commas that end kept values) matter; elsewhere only quotes and brackets do
        (strings, depth)."""
        return len(self._stack) <= 1 or (self._stack == b"{{"
                                         and self._top_key in (b"result", b"error"))

    def _read_key(self, part: bytes, whole: bool) -> None:
        """A key's bytes as they pass (past _KEY_BYTES, it is none looked for); once `whole`,
        the key, as a parser reads it, of the message or of its result or error."""
        self._key += part[: _KEY_BYTES + 1 - len(self._key)]
        if not whole:
            return
        self._reading_key = False
        key = b"" if len(self._key) > _KEY_BYTES else bytes(self._key)
        self._key.clear()
        if b"\\" in key:  # an escaped key ("\u0069d" is "id"): as a parser reads it
            try:
                key = orjson.loads(b'"' + key + b'"').encode()
            except orjson.JSONDecodeError:
                key = b""
        if len(self._stack) == 1:
            self._top_key = key
            self.keys.add(key)
            # a key given twice: its last value stands, as for a parser
            self.values.pop(_INSIDE.get(key, key), None)
        else:
            self._sub_key = key

    def _keep(self, part: bytes) -> None:
        assert self._cap is not None
        if self._cap_over or len(self._cap) + len(part) > CAPTURE_BYTES:
            self._cap_over = True
            return
        self._cap += part

    def _end_capture(self, chunk: bytes, start: int, end: int) -> None:
        self._keep(chunk[start:end])
        self.values[self._cap_name] = None if self._cap_over else bytes(self._cap or b"")
        self._cap = None
        self._cap_over = False

    def message(self) -> dict[str, Any] | None:
        """The stand-in message, or None when what passed was not one whole JSON object."""
        if self.bad or not self.done:
            return None
        out: dict[str, Any] = {}
        for key in (b"jsonrpc", b"method"):
            if key in self.keys:
                out[key.decode()] = True
        if b"id" in self.keys:
            out["id"] = _loads(self.values.get(b"id"))
        if b"error" in self.keys:
            code = self.values.get(b"code")
            out["error"] = {} if code is None else {"code": _loads(code)}
        if b"result" in self.keys:
            is_error = self.values.get(b"isError")
            out["result"] = {} if is_error is None else {"isError": _loads(is_error)}
        return out

    def method(self) -> str | None:
        """The message's `method`, once its value has passed (even before the message ends):
        what a relay judges a large event by before it is whole."""
        raw = self.values.get(b"method")
        value = _loads(raw) if raw is not None else None
        return value if isinstance(value, str) else None


def _loads(raw: bytes | None) -> Any:
    """A kept value; a value too large to keep (or not JSON) is an empty object."""
    if raw is None:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
