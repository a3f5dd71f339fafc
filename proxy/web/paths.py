"""Names in URL paths, both ways. Every URL Tollhouse builds puts a name in its path as one
segment percent-encoded with nothing kept (`segment`), and every route Quart serves is matched
on the path as it was sent (the ASGI `raw_path`) with each name decoded only after the match
(`SegmentMap`). So a name is always exactly one segment: `x%2F..%2Fservers%2Fprod` reaches the
handler as the name `x/../servers/prod` (which no rule lets exist: 404), never as the path
`/servers/prod`."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote, unquote

from quart import Quart
from quart.routing import QuartMap
from quart.wrappers import BaseRequestWebsocket
from werkzeug.routing import Map, MapAdapter
from werkzeug.routing.converters import PathConverter, UnicodeConverter


def segment(value: object) -> str:
    """`value` as one path segment: every character but letters, digits and `_.-~`
    percent-encoded, so no name can add, remove or climb a segment."""
    return quote(str(value), safe="")


class Segment(UnicodeConverter):
    """One segment of the raw path, decoded once it is matched."""

    def to_python(self, value: str) -> str:
        return unquote(value)

    def to_url(self, value: Any) -> str:
        return segment(value)


class Segments(PathConverter):
    """The rest of the raw path (static files), decoded once it is matched."""

    def to_python(self, value: str) -> str:
        return unquote(value)


class SegmentMap(QuartMap):
    """Quart's map, bound to the path as sent instead of the decoded one (in which `%2F` has
    become a `/` that the router would split on)."""

    default_converters: ClassVar[dict[str, type]] = {  # type: ignore[assignment,misc]
        **Map.default_converters, "default": Segment, "string": Segment, "path": Segments}

    def bind_to_request(self, request: BaseRequestWebsocket, subdomain: str | None,
                        server_name: str | None) -> MapAdapter:
        adapter = super().bind_to_request(request, subdomain, server_name)
        raw = request.scope.get("raw_path")
        if isinstance(raw, bytes):
            path = raw.partition(b"?")[0].decode("latin-1")
            root = quote(request.root_path)
            adapter.path_info = path[len(root):] if root and path.startswith(root) else path
        return adapter


class Tollhouse(Quart):
    url_map_class = SegmentMap
