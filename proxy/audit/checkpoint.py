"""Signed checkpoints of the audit chains' heads (docs/audit-evidence.md).

A checkpoint is one row of `audit_checkpoints`: a JSON body, its SHA-256 and its Ed25519
signature. The body names every chain the checkpoints know, each as `[head_seq, head_hash,
anchor_seq, anchor_hash]` (the head: the chain's last record signed; the anchor: the last
record retention removed, 0 and the chain's genesis while none was), links to the checkpoint
before it (`prev`, its hash) and says which writer wrote it and, for retention's, the cut.

Each writer writes one every `checkpoint_every_s` while its head moves (and at a clean stop),
on its own connection, holding a lock for that short transaction (PostgreSQL: an advisory
lock; SQLite: the write lock): it takes the chains from the newest checkpoint that its key
verifies, sets its own chain's head from what it committed (never from the database, which
anyone with access could have edited) and signs the lot. So a checkpoint names the heads of
every writer, and a chain deleted whole, or cut back past its last signed head, is detected.
Retention (`proxy.audit.retention`) moves anchors forward the same way. A chain whose every
record retention removed (anchor = head) is left out of the checkpoints after that one; its
writer, if it writes again, anchors its entry at the head it last signed.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proxy.audit.chain import Chain, Head, genesis, key_id
from proxy.storage import db

log = logging.getLogger("tollhouse.audit")

_LOCK_KEY = int.from_bytes(b"tollchkp", "big") - 2**63
VERSION = 1
_BASE_SEARCH = 50  # checkpoints looked back through for the newest this key verifies

Entries = dict[str, list[Any]]  # chain id -> [head_seq, head_hash, anchor_seq, anchor_hash]


class Signer:
    """The chain's signing key (`[audit.chain] signing_key`), and what verifies it."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public: Ed25519PublicKey = key.public_key()
        self.key_id = key_id(self.public)

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def __repr__(self) -> str:  # never the key
        return f"Signer(key_id={self.key_id})"


@dataclass(frozen=True)
class Stored:
    """One checkpoint as stored."""

    seq: int
    at: float
    writer: str
    key_id: str
    body: str
    hash: str
    signature: str

    def parsed(self) -> dict[str, Any]:
        value = orjson.loads(self.body)
        if not isinstance(value, dict):
            raise TypeError("not an object")
        return value

    def verified_by(self, public: Ed25519PublicKey) -> bool:
        """Whether this row's body is what its hash says and `public` signed it."""
        try:
            if hashlib.sha256(self.body.encode()).hexdigest() != self.hash:
                return False
            public.verify(bytes.fromhex(self.signature), self.body.encode())
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True


SELECT = "SELECT seq, at, writer, key_id, body, hash, signature FROM audit_checkpoints"


def newest(conn: db.Connection, database: db.Database, limit: int) -> list[Stored]:
    rows = conn.execute(database.sql(f"{SELECT} ORDER BY seq DESC LIMIT {int(limit)}"),
                        ()).fetchall()
    return [Stored(int(r[0]), float(r[1]), r[2], r[3], r[4], r[5], r[6]) for r in rows]


def write(conn: db.Connection, database: db.Database, signer: Signer, writer: str,
          update: Callable[[Entries], None], now: float, cut: float | None = None) -> int:
    """One checkpoint, in a transaction of its own holding the checkpoints' lock: the chains
    of the newest checkpoint this key verifies (less those retention emptied), changed by
    `update`, signed. Its number."""
    try:
        _lock(conn, database)
        rows = newest(conn, database, _BASE_SEARCH)
        entries = _carried(rows, signer)
        update(entries)
        last = rows[0] if rows else None
        seq = (last.seq + 1) if last else 1
        body = {"v": VERSION, "seq": seq, "prev": last.hash if last else None, "at": now,
                "writer": writer, "key": signer.key_id, "cut": cut, "chains": entries}
        text = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        conn.execute(database.sql(
            "INSERT INTO audit_checkpoints (seq, at, writer, key_id, body, hash, signature) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"),
            (seq, now, writer, signer.key_id, text.decode(),
             hashlib.sha256(text).hexdigest(), signer.sign(text).hex()))
        conn.commit()
    except BaseException:
        with suppress(Exception):
            conn.rollback()
        raise
    return seq


def _lock(conn: db.Connection, database: db.Database) -> None:
    if database.postgresql:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,)).fetchall()
    else:
        with suppress(Exception):
            conn.rollback()  # (BEGIN IMMEDIATE needs no transaction open)
        conn.execute("BEGIN IMMEDIATE")


def _carried(rows: list[Stored], signer: Signer) -> Entries:
    """The chains the next checkpoint starts from: the newest checkpoint's that this key
    verifies (one it does not is never carried on: it may be forged), without the chains
    retention emptied."""
    for i, row in enumerate(rows):
        if not row.verified_by(signer.public):
            continue
        if i:
            log.error("audit chain: checkpoint %d does not verify with this gateway's key "
                      "(forged, altered, or another key's): the chains are carried on from "
                      "checkpoint %d", rows[0].seq, row.seq)
        try:
            chains = row.parsed().get("chains") or {}
        except (ValueError, TypeError):
            return {}
        return {c: list(e) for c, e in chains.items() if int(e[0]) > int(e[2])}
    if rows:
        log.error("audit chain: none of the last %d checkpoints verifies with this gateway's "
                  "key: this checkpoint names only the chains written from now on", len(rows))
    return {}


class Checkpoints:
    """The checkpoints of one writer's chain, written by its writer thread on its connection
    (`due_in`, then `write` when it is time)."""

    RETRY_S = 5.0

    def __init__(self, database: db.Database, signer: Signer, chain: Chain, every_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._database = database
        self._signer = signer
        self._chain = chain
        self._every_s = every_s
        self._clock = clock
        self._last_at = clock()
        self._signed: Head | None = None  # the head of ours the last checkpoint names
        self.written = 0

    @property
    def chain(self) -> Chain:
        return self._chain

    def postpone(self) -> None:
        """A checkpoint failed: the next try in RETRY_S."""
        self._last_at = self._clock() - self._every_s + self.RETRY_S

    def due_in(self) -> float | None:
        """Seconds until a checkpoint is due (0: now); None while the head has not moved
        since the last one."""
        head = self._chain.head
        if head.seq == 0 or (self._signed is not None and self._signed.seq == head.seq):
            return None
        return max(0.0, self._last_at + self._every_s - self._clock())

    def write(self, conn: db.Connection) -> None:
        """A checkpoint with this writer's head as it committed it."""
        head = self._chain.head
        chain_id = self._chain.id
        signed = self._signed

        def update(entries: Entries) -> None:
            entry = entries.get(chain_id)
            if entry is None:  # never signed; or retention emptied it at the head we signed
                anchor = (signed.seq, signed.digest) if signed else (0, genesis(chain_id))
                entry = [0, "", anchor[0], anchor[1].hex()]
            entries[chain_id] = [head.seq, head.digest.hex(), entry[2], entry[3]]

        now = self._clock()
        write(conn, self._database, self._signer, chain_id, update, now)
        self._last_at = now
        self._signed = head
        self.written += 1
