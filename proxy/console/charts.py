"""Charts drawn on the server as SVG (no script, no style attribute: the CSP allows neither
inline; colours are classes in console.css). Input is the API's aggregated series, never rows."""

from __future__ import annotations

import time
from typing import Any

from markupsafe import Markup, escape

WIDTH, HEIGHT, PAD = 720, 160, 24
STATUSES = ("ok", "denied", "error", "cancelled")


def stacked(buckets: list[dict[str, Any]], bucket_s: int, what: str = "MCP requests"
            ) -> Markup:
    """`what` per bucket, stacked by status, with a title per bar for screen readers; an
    empty period says what would be drawn."""
    if not buckets or not any(b[s] for b in buckets for s in STATUSES):
        return Markup(f"<p class='empty'>No {escape(what)} in this period: each one the "
                      "gateway records would be drawn here, per "
                      f"{_span(bucket_s)}, by status.</p>")
    top = max(1, max(sum(b[s] for s in STATUSES) for b in buckets))
    step = (WIDTH - 2 * PAD) / len(buckets)
    parts = [(f"<svg class='chart' viewBox='0 0 {WIDTH} {HEIGHT + PAD}' role='img' "
             f"aria-label='{escape(what)} per {_span(bucket_s)}, by status; highest {top}'>"),
             f"<text class='axis' x='{PAD}' y='12'>{top}</text>",
             f"<line class='base' x1='{PAD}' y1='{HEIGHT}' x2='{WIDTH - PAD}' y2='{HEIGHT}'/>"]
    for i, b in enumerate(buckets):
        y = float(HEIGHT)
        x = PAD + i * step
        for status in STATUSES:
            h = (HEIGHT - 20) * b[status] / top
            if h <= 0:
                continue
            y -= h
            parts.append(f"<rect class='s-{status}' x='{x:.1f}' y='{y:.1f}' "
                         f"width='{max(step - 1, 1):.1f}' height='{h:.1f}'>"
                         f"<title>{_clock(b['start'])}: {b[status]} {status}</title></rect>")
    parts.append(f"<text class='axis' x='{PAD}' y='{HEIGHT + 16}'>"
                 f"{_clock(buckets[0]['start'])}</text>")
    parts.append(f"<text class='axis end' x='{WIDTH - PAD}' y='{HEIGHT + 16}'>"
                 f"{_clock(buckets[-1]['start'] + bucket_s)}</text></svg>")
    return Markup("".join(parts))


def bars(rows: list[tuple[str, int]], what: str = "tool calls") -> Markup:
    """Horizontal bars: a label and a count each."""
    if not rows:
        return Markup(f"<p class='empty'>No {escape(what)} in this period: the busiest "
                      "endpoints and tools would be drawn here.</p>")
    top = max(1, max(n for _, n in rows))
    line = 22
    parts = [(f"<svg class='chart' viewBox='0 0 {WIDTH} {line * len(rows) + 4}' role='img' "
             f"aria-label='{escape(what)}, busiest first'>")]
    for i, (label, n) in enumerate(rows):
        w = (WIDTH - 300) * n / top
        y = i * line + 2
        parts.append(f"<text class='label' x='0' y='{y + 15}'>{escape(label[:40])}</text>"
                     f"<rect class='s-ok' x='260' y='{y}' width='{max(w, 1):.1f}' "
                     f"height='{line - 6}'/><text class='label' x='{266 + w:.1f}' "
                     f"y='{y + 15}'>{n}</text>")
    parts.append("</svg>")
    return Markup("".join(parts))


def _span(seconds: int) -> str:
    if seconds % 3600 == 0:
        return "hour" if seconds == 3600 else f"{seconds // 3600} hours"
    if seconds % 60 == 0:
        return "minute" if seconds == 60 else f"{seconds // 60} minutes"
    return f"{seconds} seconds"


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + " UTC"
