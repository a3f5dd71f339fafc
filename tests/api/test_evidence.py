"""The audit evidence's status through /api/v1 and the console (issue 39 item 5): a gateway with
the chain on (a checkpoint a second) and two webhook exports, one to a receiver started here and
one to a port nobody listens on. /api/v1/audit/chain shows the last signed checkpoint and, once
`tollhouse audit verify --by ...` ran, who verified, when and what it found;
/api/v1/audit/exports each export's sent, failed, lag and last error; /console/evidence both,
for an auditor and an administrator, and for no one else."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from quart import Quart, Response, request

from proxy.auth import keys as api_keys
from proxy.demo import demo_app
from proxy.people.accounts import Accounts
from proxy.runtime import cli
from tests import db_backends
from tests.api.test_api import detail
from tests.helpers import until
from tests.stack import Urls, gateway_stack

PASSWORD = "audrey-password"


def receiver() -> tuple[Quart, list[bytes]]:
    """A webhook receiver: every body it takes."""
    app, bodies = Quart(__name__), []

    @app.post("/hook")
    async def hook() -> Response:
        bodies.append(await request.get_data())
        return Response(b"", 204)

    return app, bodies


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class World:
    url: str
    db: str
    auditor: httpx.AsyncClient  # an API key of role auditor
    admin: httpx.AsyncClient
    public_key: Path
    bodies: list[bytes]


@asynccontextmanager
async def world(tmp_path: Path, *, chain: bool = True) -> AsyncIterator[World]:
    db = db_backends.url("main")
    accounts = Accounts(db)
    accounts.create_local("root", "root-password", admin=True)
    accounts.create_local("audrey", PASSWORD, roles=["auditor"])
    accounts.create_local("pat", "pat-password")
    accounts.close()
    _, auditor_key = api_keys.create(db, "siem-reader", [], role="auditor")
    _, admin_key = api_keys.create(db, "ci", [], role="admin")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = tmp_path / "audit-public.pem"
    public.write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    hook, bodies = receiver()
    down = closed_port()

    def config(urls: Urls) -> dict[str, Any]:
        exports = [{"name": "siem", "kind": "webhook", "format": "native", "secret": "s" * 32,
                    "url": f"{urls.upstreams['hook']}/hook"},
                   {"name": "lake", "kind": "webhook", "secret": "s" * 32, "retry_max_s": 1,
                    "url": f"http://127.0.0.1:{down}/hook"}]
        return {"server": {"public_url": urls.gateway},
                "auth": {"mode": "jwt"}, "oauth_server": {"enabled": True},
                "database": {"url": db}, "state": {"url": "memory"},
                "upstreams": [{"name": "cfgd", "url": f"{urls.upstream}/mcp"}],
                "audit": {"chain": {"enabled": chain, "signing_key": pem,
                                    "checkpoint_every_s": 1},
                          "exports": exports if chain else []}}

    async with gateway_stack(config, upstream=demo_app(), upstreams={"hook": hook},
                             secret_key="k") as site, \
            httpx.AsyncClient(headers={"Authorization": f"Bearer {auditor_key}"}) as auditor, \
            httpx.AsyncClient(headers={"Authorization": f"Bearer {admin_key}"}) as admin:
        yield World(site.url, db, auditor, admin, public, bodies)


async def signed_in(w: World, name: str, password: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(follow_redirects=False, timeout=10)
    answer = await client.post(f"{w.url}/signin", data={"name": name, "password": password},
                               headers={"Origin": w.url})
    assert answer.status_code == 303
    return client


async def test_chain_and_exports_status(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        api = f"{w.url}/api/v1"
        # records to chain and export: reads of the audit log are records of their own
        for _ in range(3):
            assert (await w.auditor.get(f"{api}/audit")).status_code == 200
        chain: dict[str, Any] = {}

        async def checkpointed() -> bool:
            nonlocal chain
            chain = (await w.auditor.get(f"{api}/audit/chain")).json()
            return chain["checkpoint_seq"] is not None

        await until(checkpointed, deadline_s=30, what="a signed checkpoint")
        assert chain["enabled"] is True and chain["chains"] >= 1
        assert chain["verified_at"] is None and chain["verified_by"] is None

        exports: dict[str, dict[str, Any]] = {}

        async def exported() -> bool:
            nonlocal exports
            answer = await w.auditor.get(f"{api}/audit/exports")
            exports = {x["name"]: x for x in answer.json()["items"]}
            return exports["siem"]["sent"] >= 3 and exports["lake"]["failed"] >= 1

        await until(exported, deadline_s=30, what="records sent, and a send failed")
        assert list(exports) == ["siem", "lake"]  # the config's order
        siem, lake = exports["siem"], exports["lake"]
        assert (siem["kind"], siem["format"], siem["last_error"]) == ("webhook", "native", None)
        assert siem["last_sent_at"] is not None and len(w.bodies) >= 1
        assert lake["sent"] == 0 and lake["backlog"] >= 1 and lake["lag_s"] > 0
        assert lake["last_error"] and lake["last_error_at"] is not None
        assert "s" * 32 not in str(lake)  # never the webhook's secret

        # an auditor verifies with the public key alone, and is named
        code = await asyncio.to_thread(cli.main, [
            "audit", "verify", "--db", w.db, "--public-key", str(w.public_key),
            "--by", "ada (external auditor)"])
        assert code == 0
        chain = (await w.auditor.get(f"{api}/audit/chain")).json()
        assert (chain["verified_by"], chain["verified_ok"]) == ("ada (external auditor)", True)
        assert chain["verified_detail"].startswith("verified ")
        assert chain["verified_checkpoint_seq"] is not None

        # the console's page, for the auditor
        audrey = await signed_in(w, "audrey", PASSWORD)
        page = await audrey.get(f"{w.url}/console/evidence")
        assert page.status_code == 200, page.text[:300]
        for shown in ("ada (external auditor)", "passed",
                      f"#{chain['verified_checkpoint_seq']} at", "siem", "lake",
                      lake["last_error"][:20]):
            assert shown in page.text, shown
        assert 'href="/console/evidence" aria-current="page"' in page.text
        # an administrator reads the same; a user neither page nor route
        assert (await w.admin.get(f"{api}/audit/exports")).status_code == 200
        pat = await signed_in(w, "pat", "pat-password")
        refused = await pat.get(f"{w.url}/console/evidence")
        assert refused.status_code == 403 and "Administrators only" in refused.text
        for path in ("/audit/chain", "/audit/exports"):
            answer = await pat.get(api + path)
            assert answer.status_code == 403 and detail(answer) == "administrators only"
        for client in (audrey, pat):
            await client.aclose()


async def test_with_the_chain_off_and_no_export(tmp_path: Path) -> None:
    async with world(tmp_path, chain=False) as w:
        api = f"{w.url}/api/v1"
        chain = (await w.auditor.get(f"{api}/audit/chain")).json()
        assert chain["enabled"] is False and chain["checkpoint_seq"] is None
        assert (await w.auditor.get(f"{api}/audit/exports")).json() == {"items": []}
        audrey = await signed_in(w, "audrey", PASSWORD)
        page = await audrey.get(f"{w.url}/console/evidence")
        assert page.status_code == 200
        assert "The audit chain is off" in page.text and "No export" in page.text
        assert "never: run" in page.text
        await audrey.aclose()
