"""The audit evidence page (/console/evidence), for administrators and auditors: the chain's
status (on or off, the last signed checkpoint, the last `tollhouse audit verify`: when, by whom,
what it found) and each `[[audit.exports]]`'s lag, backlog, failures and last error, read from
/api/v1/audit/chain and /api/v1/audit/exports (proxy.api.evidence) as any script would."""

from __future__ import annotations

from quart import Response

from proxy.console.api import call
from proxy.console.render import render
from proxy.people.accounts import User
from proxy.people.signin import Web


async def evidence(web: Web, user: User) -> Response:
    chain = await call(web, "GET", "/audit/chain")
    exports = await call(web, "GET", "/audit/exports")
    if not (chain.ok and exports.ok):
        bad = chain if not chain.ok else exports
        return await render("message.html", user, bad.status,
                            title="Audit evidence unavailable", message=bad.detail)
    return await render("evidence.html", user, chain=chain.body,
                        exports=exports.body["items"])
