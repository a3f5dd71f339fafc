"""One rendering of a principal for every console page: a person's name, a key's name (and
whose it is), an OAuth client's name, with the issuer or id in the detail view. The names
come from /api/v1/principals, once for all the principals of a page; a principal it does not
know (a deleted person, a subject two issuers share) is shown as recorded."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from proxy.console.api import call
from proxy.people.signin import Web

MAX_IDS = 200  # what /api/v1/principals answers in one request


async def names(web: Web, principals: Iterable[str | None]) -> dict[str, dict[str, Any]]:
    """Each principal of `principals` (blanks left out) to its name from the API; an empty
    map when the API does not answer (the pages then show the principals as recorded)."""
    wanted = sorted({p for p in principals if p})[:MAX_IDS]
    if not wanted:
        return {}
    answer = await call(web, "GET", "/principals", params={"id": wanted})
    if not answer.ok:
        return {}
    return {item["principal"]: item for item in answer.body["items"]}


def detail(item: dict[str, Any] | None) -> str:
    """What tells this principal apart, for a title and a detail view."""
    if not item:
        return ""
    kind = item.get("kind")
    if kind == "key":
        owner = f", {item['user']}'s" if item.get("user") else ""
        return f"API key {item['key_id']}{owner}"
    if kind == "client":
        return f"OAuth client {item['client_id']}"
    if kind == "person":
        return f"{item['issuer']} · {item['subject']}"
    return "not a known person, key or client"
