"""/api/v1/audit/chain and /api/v1/audit/exports: the audit evidence's status (issue 39), for
administrators and auditors, as the console's evidence page shows it. The chain's: whether it
is on, its last signed checkpoint, and the last `tollhouse audit verify` (when, by whom, its
outcome and the last checkpoint it found intact), from `proxy.audit.chain.status`. Each
`[[audit.exports]]`'s: its backlog and lag, what it sent, what failed or was dropped, and its
last error, from `proxy.audit.exports.status`. Both read the database, so any gateway on it
answers for every writer and every export. Neither is an audit record: they are not records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from quart import Response

from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.audit import chain as audit_chain
from proxy.audit import exports as audit_exports
from proxy.config.tables import ExportConfig
from proxy.held import held
from proxy.storage import db


async def chain(who: Caller, api: Api) -> Response:
    enabled = held().cfg.audit.chain.enabled  # read at start-up, as the writer reads it
    found = await asyncio.to_thread(audit_chain.status, api.database, enabled)
    return json_response(found.as_dict())


def _exports(target: db.Target, configured: Sequence[ExportConfig]) -> list[Any]:
    with db.using(target) as database:
        return list(audit_exports.status(database, configured))


async def exports(who: Caller, api: Api) -> Response:
    rows = await asyncio.to_thread(_exports, api.database, held().cfg.audit.exports)
    return json_response({"items": rows})
