"""Tamper evidence for the audit log (docs/audit-evidence.md): the hash chain each writer
keeps, the canonical form it hashes, the signing and public keys, and the chain's `status`
for the console and the API.

One chain per writer, not one for the whole database: every process's audit writer thread
(`proxy.audit.commit.Committer`) starts a chain of its own when it starts (`chain_id`: host,
pid and a random part) and links each record it commits to the one it committed before:

    chain_hash(n) = SHA-256(digest(n - 1) || canonical(chain_id, n, every audited column))

with digest(0) = SHA-256("tollhouse-audit-chain/1" NUL chain_id). A chain is written by one
thread, in the transactions it commits anyway, so no writer ever waits for another (one
global chain would serialise every commit of every replica and worker on one database). The
link is computed on the writer thread inside the commit: nothing on a call's path. A record
replayed after a crash (the journal, the fallback file) goes into the replaying writer's
chain, once: a retry or a replay links only the records not in the database yet, from the
head as the database has it.

The chains' heads are signed (Ed25519) in checkpoints (`proxy.audit.checkpoint`) that name
every chain, so a chain removed whole is missed; `proxy.audit.verify` checks links,
checkpoints and signatures.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proxy.storage import db

CHAIN_COLUMNS = ("chain_id", "chain_seq", "chain_hash")
_GENESIS = b"tollhouse-audit-chain/1\x00"
_sha256 = hashlib.sha256
_dumps = orjson.dumps


def genesis(chain_id: str) -> bytes:
    """The digest a chain's first record links to: bound to the chain's id, so a record
    moved into another chain does not verify there."""
    return _sha256(_GENESIS + chain_id.encode()).digest()


def canonical(chain_id: str, seq: int, row: tuple[Any, ...] | list[Any]) -> bytes:
    """A record's canonical form: its chain and place, then every audited column
    (`proxy.audit.commit.COLUMNS`, in that order) as one JSON array. The numbers are
    spelt as the database gives them back (ts and duration_ms as floats, the byte counts
    as integers), so the writer and a verifier reading the row hash the same bytes. The
    actor (a column added later, migration 28) is in it only when the record has one, so a
    record written before it hashes as it did."""
    actor = (row[20],) if len(row) > 20 and row[20] is not None else ()
    return _dumps((chain_id, seq, float(row[0]), row[1], row[2], row[3], row[4], row[5],
                   row[6], row[7], row[8], float(row[9]), int(row[10]), int(row[11]),
                   *row[12:20], *actor))


def link(previous: bytes, chain_id: str, seq: int, row: tuple[Any, ...] | list[Any]) -> bytes:
    """The digest of record `seq` of a chain, after the one whose digest is `previous`."""
    return _sha256(previous + canonical(chain_id, seq, row)).digest()


def new_chain_id() -> str:
    """A writer's chain id: which host and process wrote it, and a random part (a pid is
    reused)."""
    host = socket.gethostname().split(".")[0][:40] or "host"
    return f"{host}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class Head:
    """Where a chain stands: its last record's place and digest (seq 0: no record yet)."""

    seq: int
    digest: bytes


class Chain:
    """One writer's chain, kept by its writer thread only. `link` extends a batch's rows
    with their chain columns from the head; `advance` moves the head once that batch's
    transaction committed (a batch that failed leaves it where it was: its retry links
    again from there)."""

    def __init__(self, chain_id: str | None = None) -> None:
        self.id = chain_id or new_chain_id()
        self.head = Head(0, genesis(self.id))

    def link(self, rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], Head]:
        """`rows` with (chain_id, chain_seq, chain_hash) added, and the head after them."""
        chain_id = self.id
        seq, digest = self.head.seq, self.head.digest
        out = []
        for row in rows:
            seq += 1
            digest = _sha256(digest + canonical(chain_id, seq, row)).digest()
            out.append((*row, chain_id, seq, digest.hex()))
        return out, Head(seq, digest)

    def advance(self, head: Head) -> None:
        self.head = head

    def resync(self, conn: db.Connection, database: db.Database) -> None:
        """The head as the database has it: before a retry or a replay links, since a
        commit whose answer was lost may have landed (and moved the chain on)."""
        row = conn.execute(database.sql(
            "SELECT chain_seq, chain_hash FROM audit WHERE chain_id = ? "
            "ORDER BY chain_seq DESC LIMIT 1"), (self.id,)).fetchone()
        if row is not None and int(row[0]) > self.head.seq:
            self.head = Head(int(row[0]), bytes.fromhex(row[1]))


# -- keys ------------------------------------------------------------------------------------

def key_id(public: Ed25519PublicKey) -> str:
    """A public key's short name, in each checkpoint: which key signed it."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _sha256(raw).hexdigest()[:16]


def public_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public key in PEM (SubjectPublicKeyInfo), what `tollhouse audit public-key`
    prints and `verify --public-key` reads."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_public(pem: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM; ValueError if it is not one."""
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise TypeError("not an Ed25519 public key")
    return key


# -- status, for the console and the API -----------------------------------------------------

@dataclass(frozen=True)
class ChainStatus:
    """The chain as the console and `/api/v1` show it."""

    enabled: bool
    checkpoint_seq: int | None = None  # the last checkpoint
    checkpoint_at: float | None = None
    chains: int = 0  # the chain heads it names
    verified_at: float | None = None  # the last `tollhouse audit verify`
    verified_by: str | None = None
    verified_ok: bool | None = None
    verified_detail: str | None = None
    verified_checkpoint_seq: int | None = None  # the last checkpoint it found intact
    verified_checkpoint_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def status(database: db.Target, enabled: bool) -> ChainStatus:
    """Whether the chain is on (`[audit.chain] enabled`), the last checkpoint, and the last
    verification's outcome. Blocking: call it off the event loop. Fields are None where the
    database has none (or not the tables yet)."""
    checkpoint = _rows(database, "SELECT seq, at, body FROM audit_checkpoints "
                                 "ORDER BY seq DESC LIMIT 1")
    verified = _rows(database, "SELECT at, by_name, ok, detail, checkpoint_seq, "
                               "checkpoint_at FROM audit_verifications "
                               "ORDER BY at DESC, id DESC LIMIT 1")
    fields: dict[str, Any] = {}
    if checkpoint:
        seq, at, body = checkpoint[0]
        try:
            chains = len(orjson.loads(body).get("chains", {}))
        except (orjson.JSONDecodeError, AttributeError):
            chains = 0
        fields.update(checkpoint_seq=int(seq), checkpoint_at=float(at), chains=chains)
    if verified:
        at, by, ok, detail, cp_seq, cp_at = verified[0]
        fields.update(verified_at=float(at), verified_by=by, verified_ok=bool(ok),
                      verified_detail=detail,
                      verified_checkpoint_seq=None if cp_seq is None else int(cp_seq),
                      verified_checkpoint_at=None if cp_at is None else float(cp_at))
    return ChainStatus(enabled=enabled, **fields)


def _rows(target: db.Target, text: str) -> list[Any]:
    """Rows of a query; none when the table is not there (a database not migrated yet)."""
    with db.using(target) as database, database.lease() as conn:
        try:
            return list(conn.execute(text).fetchall())
        except database.missing_table:
            return []
        finally:
            conn.rollback()
