"""/api/v1/principals: the names of the principals audit records and usage rows hold, so that a
page shows a person's name, a key's name or an OAuth client's name rather than the gateway's
internal string. A record's principal is what the edge knew of the caller: at /mcp the
subject alone (`local:alice`, an identity provider's `sub`, `key:<id>`, `client:<id>`), at
/api/v1 `issuer|subject`. Each asked string is answered with its kind, its name and what
tells it apart (issuer and subject, key id, client id); one read per kind for a whole page."""

from __future__ import annotations

import asyncio
from typing import Any

from quart import Response, request

from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.errors import Invalid
from proxy.storage import db

MAX_IDS = 200  # a page's principals: the console asks for at most a page of rows' worth
OWNED = "me:"  # a person's own key is stored as `me:<user id>:<name>` (proxy.api.mine)
KEY_ISSUER = "tollhouse:api-key"


def _split(raw: str) -> tuple[str | None, str]:
    """(issuer or None, subject) of a record's principal."""
    if "|" in raw:
        issuer, subject = raw.split("|", 1)
        return issuer, subject
    return None, raw


def _in(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join('?' for _ in values)})"


def resolve(target: db.Target, raws: list[str]) -> list[dict[str, Any]]:
    """Each of `raws` named: `kind` person, key, client or unknown; `name` for people to read;
    `issuer`, `subject`, `key_id`, `client_id`, `user` (the person's name, for a person or
    their own key) where known."""
    split = {raw: _split(raw) for raw in raws}
    key_ids = sorted({s[4:] for _, s in split.values() if s.startswith("key:")})
    client_ids = sorted({s[7:] for _, s in split.values() if s.startswith("client:")})
    subjects = sorted({s for _, s in split.values()
                       if not s.startswith(("key:", "client:")) and s})
    with db.using(target) as database, database.transaction() as conn:
        keys = {r[0]: r[1] for r in conn.execute(database.sql(
            f"SELECT id, name FROM api_keys WHERE {_in('id', key_ids)}"),
            tuple(key_ids)).fetchall()} if key_ids else {}
        clients = {r[0]: r[1] for r in conn.execute(database.sql(
            f"SELECT client_id, name FROM oauth_clients WHERE "
            f"{_in('client_id', client_ids)}"), tuple(client_ids)).fetchall()} \
                if client_ids else {}
        owners = sorted({n.split(":", 2)[1] for n in keys.values()
                         if n.startswith(OWNED) and n.count(":") >= 2})
        people: list[tuple[Any, ...]] = conn.execute(database.sql(
            f"SELECT id, name, issuer, subject FROM users WHERE {_in('subject', subjects)} "
            f"OR {_in('id', owners or [''])}"), (*subjects, *(owners or [""]))
        ).fetchall() if subjects or owners else []
    by_id = {str(r[0]): str(r[1]) for r in people}
    by_subject: dict[str, list[tuple[str, str]]] = {}
    for _, name, issuer, subject in people:
        by_subject.setdefault(str(subject), []).append((str(issuer), str(name)))
    return [_named(raw, *split[raw], keys, clients, by_id, by_subject) for raw in raws]


def _named(raw: str, issuer: str | None, subject: str, keys: dict[str, str],
           clients: dict[str, str], by_id: dict[str, str],
           by_subject: dict[str, list[tuple[str, str]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"principal": raw, "kind": "unknown", "name": raw or "(none)",
                           "issuer": issuer, "subject": subject}
    if subject.startswith("key:"):
        key_id = subject[4:]
        stored = keys.get(key_id)
        out.update(kind="key", key_id=key_id, issuer=issuer or KEY_ISSUER,
                   name=stored or f"key {key_id} (deleted)")
        if stored and stored.startswith(OWNED) and stored.count(":") >= 2:
            _, uid, own = stored.split(":", 2)
            out.update(name=own, user=by_id.get(uid))
        return out
    if subject.startswith("client:"):
        client_id = subject[7:]
        out.update(kind="client", client_id=client_id,
                   name=clients.get(client_id, f"client {client_id}"))
        return out
    found = [(i, n) for i, n in by_subject.get(subject, []) if issuer is None or i == issuer]
    if len(found) == 1:  # a subject two issuers both use stays as it is: not guessed
        out.update(kind="person", issuer=found[0][0], name=found[0][1], user=found[0][1])
    return out


async def principals(who: Caller, api: Api) -> Response:
    raws = list(dict.fromkeys(request.args.getlist("id")))
    if len(raws) > MAX_IDS:
        raise Invalid([{"loc": ["query", "id"], "msg": f"at most {MAX_IDS} principals a "
                        "request", "type": "value_error"}])
    items = await asyncio.to_thread(resolve, api.database, raws) if raws else []
    return json_response({"items": items})
