"""Walking a call's arguments or a result for what a `Detector` finds, redacting in place.

Every string is read (text content, structured content, a prompt's messages, a resource's
text) but for the fields that carry binary data or identify rather than say something: an
image's or audio's base64 `data`, a resource's `blob`, `mimeType`, `type`, `uri`."""

from __future__ import annotations

from typing import Any

from policies.guardrails.detect import Detector

SKIP = frozenset({"data", "blob", "mimeType", "type", "uri", "_meta", "annotations"})


def scan(node: Any, detector: Detector, redact: bool) -> tuple[Any, set[str]]:
    """(`node` with each finding redacted when `redact`, else `node` as it was; the kinds
    found). Dicts and lists are edited in place; a string comes back replaced."""
    kinds: set[str] = set()
    return _walk(node, detector, redact, kinds), kinds


def _walk(node: Any, detector: Detector, redact: bool, kinds: set[str]) -> Any:
    if isinstance(node, str):
        if redact:
            text, found = detector.redact(node)
            kinds |= found
            return text
        kinds.update(f.kind for f in detector.find(node))
        return node
    if isinstance(node, dict):
        for key, value in node.items():
            if key in SKIP or not isinstance(value, (str, dict, list)):
                continue
            new = _walk(value, detector, redact, kinds)
            if new is not value:
                node[key] = new
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, (str, dict, list)):
                new = _walk(value, detector, redact, kinds)
                if new is not value:
                    node[i] = new
    return node
