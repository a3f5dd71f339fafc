"""Walking a call's arguments or a result for what a `Detector` finds, redacting in place.

Every string is read (text content, structured content, a prompt's messages, a resource's
text) but for the fields that carry binary data or identify rather than say something: an
image's or audio's base64 `data`, a resource's `blob`, `mimeType`, `type`, `uri`. The strings
are scanned together, joined by a line break, so a result of many small strings (structured
content) costs one scan, not one per string; a finding is cut to the string it lies in."""

from __future__ import annotations

import bisect
from typing import Any

from policies.guardrails.detect import Detector, Finding, apply

SKIP = frozenset({"data", "blob", "mimeType", "type", "uri", "_meta", "annotations"})
SEPARATOR = "\n"

Leaf = tuple[dict[str, Any] | list[Any], Any, str]  # (container, key or index, the string)


def scan(node: Any, detector: Detector, redact: bool) -> tuple[Any, set[str]]:
    """(`node`, its strings redacted in place when `redact`; the kinds found). A bare string
    comes back replaced."""
    if isinstance(node, str):
        if redact:
            return detector.redact(node)
        return node, {f.kind for f in detector.find(node)}
    leaves: list[Leaf] = []
    _leaves(node, leaves)
    if not leaves:
        return node, set()
    starts, at = [], 0
    for _, _, text in leaves:
        starts.append(at)
        at += len(text) + len(SEPARATOR)
    found = detector.find(SEPARATOR.join(text for _, _, text in leaves))
    if not found:
        return node, set()
    if not redact:
        return node, {f.kind for f in found}
    per_leaf: dict[int, list[Finding]] = {}
    for f in found:
        i = bisect.bisect_right(starts, f.start) - 1
        last = bisect.bisect_right(starts, f.end - 1) - 1
        for j in range(i, last + 1):  # a span across strings (a key block) cut to each
            start, end = starts[j], starts[j] + len(leaves[j][2])
            per_leaf.setdefault(j, []).append(
                Finding(f.kind, max(f.start, start) - start, min(f.end, end) - start))
    kinds: set[str] = set()
    for j, spans in per_leaf.items():
        container, key, text = leaves[j]
        container[key], done = apply(text, [s for s in spans if s.end > s.start])
        kinds |= done
    return node, kinds


def _leaves(node: Any, out: list[Leaf]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in SKIP:
                continue
            if isinstance(value, str):
                out.append((node, key, value))
            elif isinstance(value, (dict, list)):
                _leaves(value, out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, str):
                out.append((node, i, value))
            elif isinstance(value, (dict, list)):
                _leaves(value, out)
