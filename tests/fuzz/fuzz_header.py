"""The `=?base64?...?=` form of a mirrored header (proxy.mcp.eras.decode_header, which reads
a client's Mcp-Name, and proxy.mcp.bridge.encode_header, which writes one to an upstream).

Input: the first byte picks the half; the rest is a header value as the edge decodes it
(latin-1), or a name as JSON would give it (UTF-8, no lone surrogates). Holds: decoding never
raises; a plain value decodes to itself; an encoded one decodes only from its one canonical
spelling; whatever is encoded is a valid header value that survives the trimming of
surrounding whitespace and decodes back to the name. The gateway reads no Mcp-Param-* header
(they are forwarded untouched), so there is none to fuzz.
"""

from __future__ import annotations

import base64
import re

from proxy.mcp.bridge import encode_header
from proxy.mcp.eras import decode_header

PREFIX, SUFFIX = "=?base64?", "?="
VISIBLE = re.compile(r"[\x21-\x7E]([\x20-\x7E]*[\x21-\x7E])?")


def check(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        value = data[1:].decode("latin-1")
        decoded = decode_header(value)
        if not (value.startswith(PREFIX) and value.endswith(SUFFIX)):
            assert decoded == value
        elif decoded is not None:
            # the one spelling of `decoded`; any other decodes to None and matches nothing
            assert value == PREFIX + base64.b64encode(decoded.encode()).decode() + SUFFIX, value
        return
    name = data[1:].decode("utf-8", "replace")
    encoded = encode_header(name)
    assert encoded == "" or VISIBLE.fullmatch(encoded), encoded
    assert decode_header(encoded) == name, (name, encoded)
    if encoded != name:
        assert encoded.startswith(PREFIX) and encoded.endswith(SUFFIX)
