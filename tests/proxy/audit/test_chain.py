"""Tamper evidence (#39 item 1) and retention with the chain on (item 4), end to end: a
gateway on Hypercorn with the chain on, a real MCP upstream and real calls; then the database
is tampered with as someone with access to it could (a field changed, a record deleted, one
inserted, two swapped, the tail cut back past the last checkpoint, a chain rewritten hashes
and all, a checkpoint forged) and `tollhouse audit verify`, run as an auditor runs it (the
public key only), must exit 1 naming the first record or checkpoint concerned. Two gateways
on one database keep a chain each; records replayed from a crashed run's journal are chained
once; retention cuts the chains at a signed anchor and verify says it verifies from there.
On SQLite and PostgreSQL (TOLLHOUSE_TEST_DATABASE)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy.audit import chain as chains
from proxy.audit.chain import genesis, link, status
from proxy.audit.checkpoint import Signer
from proxy.audit.commit import COLUMNS, Committer
from proxy.audit.database import usage
from proxy.audit.record import AuditRecord
from proxy.audit.retention import Retention
from proxy.config import ConfigError, from_dict
from proxy.runtime.cli import main
from proxy.storage.db import Database
from tests import db_backends
from tests.e2e.upstreams import stateless_json_app
from tests.stack import Site, gateway_stack

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def pem(key: Ed25519PrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def config(key: Ed25519PrivateKey, **database: Any) -> Callable[[Any], dict[str, Any]]:
    return lambda urls: {
        "upstreams": [{"name": "up", "url": f"{urls.upstream}/mcp",
                       "access": {"tools_deny": ["hidden_*"]}}],
        "audit": {"chain": {"enabled": True, "signing_key": pem(key),
                            "checkpoint_every_s": 1}},
        **({"database": {"url": db_backends.url(), **database}} if database else {}),
    }


async def calls(site: Site, n: int, tag: str) -> None:
    """`n` tools/call (ok) and one refused (denied)."""
    async with httpx.AsyncClient(timeout=10) as http:
        for i in range(n):
            body = {"jsonrpc": "2.0", "id": f"{tag}-{i}", "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": f"{tag}-{i}"}}}
            answer = await http.post(site.endpoint("up"), json=body, headers=HEADERS)
            assert answer.status_code == 200, answer.text
        body = {"jsonrpc": "2.0", "id": f"{tag}-x", "method": "tools/call",
                "params": {"name": "hidden_tool", "arguments": {}}}
        await http.post(site.endpoint("up"), json=body, headers=HEADERS)


async def chained_log(key: Ed25519PrivateKey, n: int = 10) -> None:
    """A gateway with the chain on serves `n` + 1 calls, then stops cleanly (its last
    checkpoint signs its head)."""
    app, _ = stateless_json_app()
    async with gateway_stack(config(key), upstream=app) as site:
        await calls(site, n, "a")


def verify(tmp_path: Path, key: Ed25519PrivateKey, *extra: str) -> tuple[int, str]:
    """`tollhouse audit verify` as an auditor runs it: the database and the public key."""
    public = tmp_path / "audit-public.pem"
    public.write_text(chains.public_pem(key))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["audit", "verify", "--db", db_backends.url(), "--public-key",
                     str(public), "--by", "auditor", *extra])
    return code, out.getvalue()


def execute(*statements: tuple[str, tuple[Any, ...]]) -> None:
    """Statements on the test's database in one transaction: the tampering."""
    database = Database(db_backends.url())
    try:
        with database.transaction() as conn:
            for text, args in statements:
                conn.execute(database.sql(text), args)
    finally:
        database.close()


def chain_rows() -> list[tuple[Any, ...]]:
    """(id, chain_id, chain_seq, chain_hash, *COLUMNS) of the chained records, in order."""
    return db_backends.rows(db_backends.url(), f"SELECT id, chain_id, chain_seq, chain_hash, "
                                               f"{', '.join(COLUMNS)} FROM audit WHERE "
                                               "chain_id IS NOT NULL ORDER BY chain_id, "
                                               "chain_seq")


async def test_an_untouched_log_verifies_and_the_outcome_is_recorded(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    await chained_log(key)
    rows = chain_rows()
    assert len(rows) == 11 and {r[1] for r in rows} == {rows[0][1]}
    assert [r[2] for r in rows] == list(range(1, 12))
    digest = genesis(rows[0][1])  # the links as documented, recomputed here
    for r in rows:
        digest = link(digest, r[1], r[2], r[4:])
        assert digest.hex() == r[3]
    code, out = verify(tmp_path, key)
    assert code == 0, out
    assert "from its first record" in out and "OK: verified 11 records in 1 chains" in out
    state = await asyncio.to_thread(status, db_backends.url(), True)
    assert state.enabled and state.chains == 1 and state.checkpoint_seq is not None
    assert (state.verified_by, state.verified_ok) == ("auditor", True)
    assert state.verified_checkpoint_seq == state.checkpoint_seq
    assert "verified 11 records" in (state.verified_detail or "")


def _swap(rows: list[tuple[Any, ...]]) -> list[tuple[str, tuple[Any, ...]]]:
    """Records #4 and #5 change places (their places swapped, through a free one)."""
    a, b = rows[3], rows[4]
    return [("UPDATE audit SET chain_seq = -1 WHERE id = ?", (a[0],)),
            ("UPDATE audit SET chain_seq = ? WHERE id = ?", (a[2], b[0])),
            ("UPDATE audit SET chain_seq = ? WHERE id = ?", (b[2], a[0]))]


def _insert(rows: list[tuple[Any, ...]]) -> list[tuple[str, tuple[Any, ...]]]:
    """A record inserted as #4 with a hash made the documented way, those after moved on."""
    chain_id = rows[0][1]
    moved = [("UPDATE audit SET chain_seq = ? WHERE id = ?", (-r[2], r[0])) for r in rows[3:]]
    moved += [("UPDATE audit SET chain_seq = ? WHERE id = ?", (r[2] + 1, r[0]))
              for r in rows[3:]]
    forged = list(rows[3][4:])
    forged[1], forged[2] = "forged-1", "mallory"
    digest = link(bytes.fromhex(rows[2][3]), chain_id, 4, forged)
    insert = ((f"INSERT INTO audit ({', '.join(COLUMNS)}, chain_id, chain_seq, chain_hash) "
              f"VALUES ({', '.join('?' for _ in COLUMNS)}, ?, ?, ?)"),
              (*forged, chain_id, 4, digest.hex()))
    return [*moved, insert]


def _rewrite(rows: list[tuple[Any, ...]]) -> list[tuple[str, tuple[Any, ...]]]:
    """Record #3 changed and every hash from it recomputed: only the signed head tells."""
    chain_id = rows[0][1]
    digest = bytes.fromhex(rows[1][3])
    out = []
    for i, r in enumerate(rows[2:]):
        values = list(r[4:])
        if i == 0:
            values[2] = "mallory"
        digest = link(digest, chain_id, r[2], values)
        out.append(("UPDATE audit SET principal = ?, chain_hash = ? WHERE id = ?",
                    (values[2], digest.hex(), r[0])))
    return out


TAMPERING: dict[str, tuple[Callable[[list[tuple[Any, ...]]], list[Any]], str]] = {
    "a field changed": (lambda rows: [(("UPDATE audit SET status = 'ok', denied_reason = NULL "
                                       "WHERE id = ?"), (rows[10][0],))],
                        "record #11 (audit id {11}"),
    "a record deleted": (lambda rows: [("DELETE FROM audit WHERE id = ?", (rows[5][0],))],
                         "record #6 is missing (removed): the next is #7"),
    "a record inserted": (_insert, "record #5 (audit id {4}"),
    "two records swapped": (_swap, "record #4 (audit id {5}"),
    "the tail cut": (lambda rows: [("DELETE FROM audit WHERE id >= ?", (rows[8][0],))],
                     "ends at record #8, but checkpoint"),
    "a chain rewritten": (_rewrite, "is not the record checkpoint"),
    "an unchained record": (lambda rows: [((f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES "
                                           f"({', '.join('?' for _ in COLUMNS)})"),
                                           rows[6][4:])],
                            "is in no chain"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
async def test_tampering_is_detected_and_named(case: str, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    await chained_log(key)
    rows = chain_rows()
    assert verify(tmp_path, key)[0] == 0
    tamper, said = TAMPERING[case]
    execute(*tamper(rows))
    code, out = verify(tmp_path, key)
    assert code == 1, out
    first = out.split("FAILED: ", 1)[1].splitlines()[0]
    # "{n}": the audit id of the n-th record as written
    assert said.format(*[None, *(r[0] for r in rows)]) in first, out
    if case == "the tail cut":
        assert "records #9 to #11 were removed (the tail was cut)" in first
    state = status(db_backends.url(), True)
    assert state.verified_ok is False and state.verified_detail == first


@pytest.mark.parametrize("how", ["another key", "a bad signature", "a checkpoint removed",
                                 "the checkpoints cut back"])
async def test_a_forged_or_missing_checkpoint_is_detected(how: str, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    for _ in range(3):  # three runs, a checkpoint at least each
        await chained_log(key, 2)
    assert verify(tmp_path, key)[0] == 0  # (recorded: what the last check found)
    cps = db_backends.rows(db_backends.url(), "SELECT seq, at, writer, key_id, body, hash, "
                                              "signature FROM audit_checkpoints ORDER BY seq")
    assert len(cps) >= 3
    last = cps[-1]
    body = orjson.loads(last[4])
    if how in ("another key", "a bad signature"):
        body["seq"] += 1
        body["prev"] = last[5]
        for entry in body["chains"].values():
            entry[0] += 100  # heads that were never written
        text = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        signer = Signer(Ed25519PrivateKey.generate()) if how == "another key" else None
        signature = (signer.sign(text) if signer else bytes(64)).hex()
        execute((("INSERT INTO audit_checkpoints (seq, at, writer, key_id, body, hash, "
                 "signature) VALUES (?, ?, ?, ?, ?, ?, ?)"),
                 (body["seq"], body["at"], body["writer"],
                  signer.key_id if signer else last[3], text.decode(),
                  hashlib.sha256(text).hexdigest(), signature)))
        want = ("which is not one given" if signer else
                "its signature does not verify: forged or altered")
    elif how == "a checkpoint removed":
        execute(("DELETE FROM audit_checkpoints WHERE seq = ?", (cps[-2][0],)))
        want = f"checkpoints #{cps[-2][0]} to #{cps[-2][0]} are missing (removed)"
    else:
        execute(("DELETE FROM audit_checkpoints WHERE seq = ?", (last[0],)))
        want = f"checkpoint #{last[0]}, verified on"
    code, out = verify(tmp_path, key)
    assert code == 1, out
    assert want in out.split("FAILED: ", 1)[1], out


async def test_two_gateways_on_one_database_keep_a_chain_each(tmp_path: Path) -> None:
    """Two gateways (two writers) on one database, their calls interleaved: a chain each,
    every checkpoint after both wrote naming both heads; one chain deleted whole is
    detected."""
    key = Ed25519PrivateKey.generate()
    async with gateway_stack(config(key), upstream=stateless_json_app()[0]) as one, \
            gateway_stack(config(key), upstream=stateless_json_app()[0]) as two:
        for round_ in range(3):
            await asyncio.gather(calls(one, 3, f"one-{round_}"), calls(two, 3, f"two-{round_}"))
    rows = chain_rows()
    ids = sorted({r[1] for r in rows})
    assert len(rows) == 24 and len(ids) == 2
    for chain_id in ids:
        assert [r[2] for r in rows if r[1] == chain_id] == list(range(1, 13))
    code, out = verify(tmp_path, key)
    assert code == 0 and "OK: verified 24 records in 2 chains" in out, out
    last = orjson.loads(db_backends.rows(
        db_backends.url(), "SELECT body FROM audit_checkpoints ORDER BY seq DESC")[0][0])
    assert sorted(last["chains"]) == ids and all(e[0] == 12 for e in last["chains"].values())
    execute(("DELETE FROM audit WHERE chain_id = ?", (ids[0],)))
    code, out = verify(tmp_path, key)
    assert code == 1 and f"chain {ids[0]} ends at record #0" in out, out


async def test_records_replayed_after_a_crash_are_chained_once(tmp_path: Path) -> None:
    """A crashed run's journal segment (never committed, two of its records committed
    already) is replayed by the next start into that run's chain, each record once."""
    key = Ed25519PrivateKey.generate()
    journal = tmp_path / "j"
    async with gateway_stack(config(key, audit_journal="on", audit_journal_path=str(journal)),
                             upstream=stateless_json_app()[0]) as site:
        await calls(site, 2, "before")
    committed = db_backends.rows(db_backends.url(), f"SELECT {', '.join(COLUMNS)} FROM audit "
                                                   "ORDER BY id")
    lost = [AuditRecord(endpoint="up", method="tools/call", tool="echo", principal="p",
                        request_id=f"lost-{i}", ts=time.time()) for i in range(4)]
    lines = [orjson.dumps(dict(zip(COLUMNS, row, strict=True)) | {
        "egress": None, "policy": None}) for row in committed[:2]]
    lines += [orjson.dumps(r.as_dict()) for r in lost]
    (tmp_path / "j.99999-0badc0de.1.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    async with gateway_stack(config(key, audit_journal="on", audit_journal_path=str(journal)),
                             upstream=stateless_json_app()[0]) as site:
        await calls(site, 1, "after")
    rows = chain_rows()
    assert len(rows) == 3 + 4 + 2  # the replay added the four lost ones only
    assert sorted(r[5] for r in rows if str(r[5]).startswith("lost-")) == \
        [f"lost-{i}" for i in range(4)]
    replayer = next(r[1] for r in rows if r[5] == "lost-0")
    assert [r[2] for r in rows if r[1] == replayer] == list(range(1, 7))
    code, out = verify(tmp_path, key)
    assert code == 0 and "OK: verified 9 records in 2 chains" in out, out


async def test_retention_with_the_chain_on_keeps_the_rest_verifiable(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    app, _ = stateless_json_app()
    async with gateway_stack(config(key), upstream=app) as site:
        await calls(site, 5, "old")
        serving = site.services.serving
        assert serving is not None
        await serving.audit.settled()  # (the old ones committed)
        middle = time.time()
        await calls(site, 3, "new")
    before = usage(db_backends.url(), since=middle - 3600)
    database = Database(db_backends.url())
    try:
        # a day later, with one day kept: the calls before `middle` are past it
        retention = Retention(database, 1, Signer(key), clock=lambda: middle + 86400)
        removed = await asyncio.to_thread(retention.prune)
        again = await asyncio.to_thread(retention.prune)
    finally:
        database.close()
    assert (removed, again) == (6, 0)
    left = chain_rows()
    assert [r[2] for r in left] == list(range(7, 11)) and all(r[5].startswith("new")
                                                               for r in left)
    assert usage(db_backends.url(), since=middle - 3600) == before  # the rollups keep them
    code, out = verify(tmp_path, key)
    assert code == 0, out
    assert "from retention's cut at" in out and "(after record #6)" in out
    assert "OK: verified 4 records in 1 chains" in out
    execute(("DELETE FROM audit WHERE id = ?", (left[0][0],)))  # the first one kept
    code, out = verify(tmp_path, key)
    assert code == 1 and "record #7 is missing (removed)" in out, out


async def test_retention_takes_a_stopped_writers_unsigned_tail(tmp_path: Path) -> None:
    """A writer killed before it signed its last records: once they are past the cut and
    link from its last signed head, retention signs them as it removes them. A chain never
    signed at all is taken the same way."""
    key = Ed25519PrivateKey.generate()
    await chained_log(key, 4)  # chain A: 5 records, signed at the stop
    signed = chain_rows()
    database = Database(db_backends.url())
    try:
        lot = [AuditRecord(endpoint="up", method="tools/call", request_id=f"k{i}", ts=time.time())
               for i in range(5)]
        tail = Committer(database, 0.01, None, chains.Chain(signed[0][1]))
        assert tail.attempt(lot[:2], 1, replay=True) is None  # A #6, #7: never signed
        tail.close()
        lone = Committer(database, 0.01, None, chains.Chain())
        assert lone.attempt(lot[2:], 1) is None  # chain B: never signed at all
        lone.close()
        assert verify(tmp_path, key)[0] == 0  # (links only, after the last checkpoint)
        retention = Retention(database, 1, Signer(key), clock=lambda: time.time() + 2 * 86400)
        assert await asyncio.to_thread(retention.prune) == 10
    finally:
        database.close()
    assert chain_rows() == []
    code, out = verify(tmp_path, key)
    assert code == 0 and "OK: verified 0 records in 2 chains" in out, out
    assert "from retention's cut at" in out and "(after record #7)" in out, out


async def test_retention_with_the_chain_off_removes_by_time() -> None:
    database = Database(db_backends.url())
    try:
        now = time.time()
        committer = Committer(database, 0.01, None)
        lot = [AuditRecord(endpoint="up", method="tools/call", tool="echo", principal="p",
                           request_id=f"r{i}", ts=now - (3 - i % 3) * 86400)
               for i in range(1200)]  # 400 each 3, 2 and 1 days old
        assert committer.attempt(lot, 1) is None
        committer.close()
        removed = Retention(database, 2, None, clock=lambda: now + 60).prune()
    finally:
        database.close()
    assert removed == 800  # in batches of 500
    left = db_backends.rows(db_backends.url(), "SELECT min(ts) FROM audit")
    assert left[0][0] > now - 2 * 86400


async def test_verify_since_starts_each_chain_there(tmp_path: Path) -> None:
    """`--since`: each chain from its first record at or after that time, linked to the
    stored hash of the one before; what lies before it is not read."""
    key = Ed25519PrivateKey.generate()
    app, _ = stateless_json_app()
    async with gateway_stack(config(key), upstream=app) as site:
        await calls(site, 4, "early")
        serving = site.services.serving
        assert serving is not None
        await serving.audit.settled()
        middle = time.time()
        await calls(site, 2, "late")
    rows = chain_rows()
    execute(("UPDATE audit SET principal = 'mallory' WHERE id = ?", (rows[1][0],)))
    code, out = verify(tmp_path, key)
    assert code == 1 and "record #2" in out, out
    stamp = datetime.datetime.fromtimestamp(middle, datetime.UTC).isoformat()
    code, out = verify(tmp_path, key, "--since", stamp)
    assert code == 0, out
    assert "(after record #5)" in out and "OK: verified 3 records" in out, out


async def test_the_operator_exports_the_public_key_and_verify_reads_the_config(
        tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    await chained_log(key, 2)
    (tmp_path / "signing.pem").write_text(pem(key))
    (tmp_path / "tollhouse.toml").write_text(
        f'[database]\nurl = "{db_backends.url()}"\n[audit.chain]\nenabled = true\n'
        'signing_key = "signing.pem"\n')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["audit", "public-key", "--config", str(tmp_path / "tollhouse.toml")])
    assert code == 0 and out.getvalue() == chains.public_pem(key)
    assert "PRIVATE" not in out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["audit", "verify", "--config", str(tmp_path / "tollhouse.toml")])
    assert code == 0 and "OK: verified 3 records" in out.getvalue(), out.getvalue()
    (tmp_path / "not-a-key.pem").write_text("hello")
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["audit", "verify", "--db", db_backends.url(), "--public-key",
                     str(tmp_path / "not-a-key.pem")])
    assert code == 2


def test_a_bad_signing_key_is_one_line_naming_the_key(tmp_path: Path) -> None:
    ec = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----"
    for value, said in (("", "is empty"), ("nope.pem", "cannot be read"),
                        (ec, "is not an Ed25519 private key")):
        with pytest.raises(ConfigError) as caught:
            from_dict({"audit": {"chain": {"enabled": True, "signing_key": value}}},
                      base_dir=tmp_path)
        text = str(caught.value)
        assert "'audit.chain.signing_key'" in text and said in text and "\n" not in text
        assert "MIGHAgEAMBMG" not in text
    with pytest.raises(ConfigError, match="audit.retention_days"):
        from_dict({"audit": {"retention_days": -1}})
