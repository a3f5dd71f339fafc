"""`tollhouse audit verify`: the audit chains and their signed checkpoints checked end to end
with the public key alone (docs/audit-evidence.md), and each verification's outcome recorded.

What it checks, and what it names when a check fails:

- every checkpoint: its hash, its signature by a key given, and its link to the one before
  (a checkpoint forged, altered, inserted or removed);
- a verification recorded earlier: the checkpoint it found intact is still there, unchanged
  (the checkpoints cut back);
- every chain, record by record from where it starts (its first record; retention's signed
  anchor; or `--since`): no place missing (a record removed), each record's hash follows from
  its predecessor's and its own content (a record changed, inserted or reordered), every head
  a checkpoint signed is there with that hash (records rewritten, hashes and all), and the
  chain reaches the last head signed (its tail cut back past the last checkpoint; a chain
  removed whole);
- no record outside every chain among those written while the chain was on (one inserted).

Records after a chain's last checkpoint are checked by their links only: a tail cut back to
no earlier than the last checkpoint cannot be told from records never written.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from proxy.audit.chain import genesis, key_id, link
from proxy.audit.checkpoint import SELECT, Stored
from proxy.audit.commit import COLUMNS
from proxy.storage import db

PAGE = 5000  # records read at a time
MAX_PROBLEMS = 20  # reported at most (the first is the verdict)


@dataclass
class Outcome:
    """What a verification found."""

    problems: list[str] = field(default_factory=list)
    records: int = 0
    chains: int = 0
    checkpoints: int = 0
    since: float | None = None
    starts: list[str] = field(default_factory=list)  # from where each chain was verified
    checkpoint: Stored | None = None  # the last checkpoint found intact

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    @property
    def detail(self) -> str:
        """One line: the first problem, or what was verified."""
        if self.problems:
            more = len(self.problems) - 1
            return self.problems[0] + (f" (and {more} more)" if more else "")
        last = (f"; the last checkpoint #{self.checkpoint.seq} at {when(self.checkpoint.at)}"
                if self.checkpoint else "; no checkpoint yet")
        return (f"verified {self.records} records in {self.chains} chains and "
                f"{self.checkpoints} checkpoints{last}")


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


@dataclass
class _Signed:
    """What the checkpoints say of one chain."""

    anchor: tuple[int, str] = (0, "")  # retention's last removed record (0: none)
    anchor_cut: float | None = None
    heads: dict[int, tuple[str, int]] = field(default_factory=dict)  # seq -> (hash, checkpoint)
    last: tuple[int, int, float] = (0, 0, 0.0)  # the highest head: seq, checkpoint, its time


def verify(target: db.Target, keys: list[Ed25519PublicKey], since: float | None = None
           ) -> Outcome:
    """Every check above, reading the database only."""
    outcome = Outcome(since=since)
    by_id = {key_id(k): k for k in keys}
    with _reading(target) as (database, conn):
        signed = _checkpoints(conn, database, by_id, outcome, since)
        _earlier(conn, database, outcome)
        ids = {r[0] for r in conn.execute(
            "SELECT DISTINCT chain_id FROM audit WHERE chain_id IS NOT NULL").fetchall()}
        first_ts: float | None = None
        for chain_id in sorted(ids | set(signed)):
            start = _chain(conn, database, chain_id, signed.get(chain_id, _Signed()), outcome)
            if start is not None and (first_ts is None or start < first_ts):
                first_ts = start
        outcome.chains = len(ids | set(signed))
        _unchained(conn, database, first_ts, since, outcome)
    return outcome


@contextmanager
def _reading(target: db.Target) -> Iterator[tuple[db.Database, Any]]:
    """A connection that only reads (a SQLite file is opened read-only, never created)."""
    with db.using(target) as database:
        if database.dialect == "sqlite" and not database.memory:
            if not Path(database.path).exists():
                raise FileNotFoundError(f"no database at {database.path}")
            conn = sqlite3.connect(f"file:{database.path}?mode=ro", uri=True, timeout=30)
            try:
                yield database, conn
            finally:
                conn.close()
            return
        with database.lease() as lent:
            try:
                yield database, lent
            finally:
                lent.rollback()


def _checkpoints(conn: Any, database: db.Database, keys: dict[str, Ed25519PublicKey],
                 outcome: Outcome, since: float | None) -> dict[str, _Signed]:
    """Each checkpoint's signature, hash and link to the one before; what they sign of each
    chain. With `since`, the checkpoints from the last one before it."""
    start = 0
    if since is not None:
        row = conn.execute(database.sql("SELECT max(seq) FROM audit_checkpoints WHERE at < ?"),
                           (since,)).fetchone()
        start = int(row[0]) if row and row[0] is not None else 0
    rows = conn.execute(database.sql(f"{SELECT} WHERE seq >= ? ORDER BY seq"),
                        (start,)).fetchall()
    chains: dict[str, _Signed] = {}
    before: Stored | None = None
    for r in rows:
        cp = Stored(int(r[0]), float(r[1]), r[2], r[3], r[4], r[5], r[6])
        outcome.checkpoints += 1
        problem = _checkpoint_problem(cp, before, keys)
        before = cp
        if problem:
            outcome.fail(problem)
            continue
        outcome.checkpoint = cp
        body = cp.parsed()
        for chain_id, (head_seq, head_hash, anchor_seq, anchor_hash) in body["chains"].items():
            s = chains.setdefault(chain_id, _Signed())
            s.heads[int(head_seq)] = (head_hash, cp.seq)
            if int(head_seq) >= s.last[0]:
                s.last = (int(head_seq), cp.seq, cp.at)
            if int(anchor_seq) > s.anchor[0]:
                s.anchor = (int(anchor_seq), anchor_hash)
                s.anchor_cut = body.get("cut")
    return chains


def _checkpoint_problem(cp: Stored, before: Stored | None,
                        keys: dict[str, Ed25519PublicKey]) -> str | None:
    name = f"checkpoint #{cp.seq} ({when(cp.at)})"
    key = keys.get(cp.key_id)
    if key is None:
        return f"{name} is signed by key {cp.key_id}, which is not one given: forged, or " \
               "signed by another key (give each key with --public-key)"
    if not cp.verified_by(key):
        return f"{name}: its signature does not verify: forged or altered"
    try:
        body = cp.parsed()
        if (body.get("seq") != cp.seq or body.get("at") != cp.at
                or body.get("writer") != cp.writer or not isinstance(body.get("chains"), dict)):
            return f"{name}: its row does not match its signed body: altered"
    except (ValueError, TypeError):
        return f"{name}: its body is not a checkpoint: altered"
    if before is not None:
        if cp.seq != before.seq + 1:
            return (f"checkpoints #{before.seq + 1} to #{cp.seq - 1} are missing (removed), "
                    f"between {when(before.at)} and {when(cp.at)}")
        if body.get("prev") != before.hash:
            return f"{name} does not follow checkpoint #{before.seq}: inserted or reordered"
    return None


def _earlier(conn: Any, database: db.Database, outcome: Outcome) -> None:
    """The checkpoint the last recorded verification found intact: still there, the same."""
    try:
        row = conn.execute("SELECT checkpoint_seq, checkpoint_hash, at, by_name FROM "
                           "audit_verifications WHERE ok = 1 AND checkpoint_seq IS NOT NULL "
                           "ORDER BY checkpoint_seq DESC LIMIT 1").fetchone()
    except database.errors:
        return
    if row is None:
        return
    seq, digest, at, by = int(row[0]), row[1], float(row[2]), row[3]
    found = conn.execute(database.sql("SELECT hash FROM audit_checkpoints WHERE seq = ?"),
                         (seq,)).fetchone()
    newest = conn.execute("SELECT max(seq) FROM audit_checkpoints").fetchone()[0]
    if found is None and (newest is None or int(newest) < seq):
        outcome.fail(f"checkpoint #{seq}, verified on {when(at)} by {by}, is gone: the "
                     "checkpoints (and the records after them) were cut back")
    elif found is not None and found[0] != digest:
        outcome.fail(f"checkpoint #{seq} differs from the one {by} verified on {when(at)}: "
                     "altered")


def _chain(conn: Any, database: db.Database, chain_id: str, signed: _Signed,
           outcome: Outcome) -> float | None:
    """One chain, record by record; the time of its first record verified (None: none)."""
    seq, digest = signed.anchor[0], (bytes.fromhex(signed.anchor[1]) if signed.anchor[0]
                                     else genesis(chain_id))
    where = (f"from retention's cut at {when(signed.anchor_cut)} (after record "
             f"#{seq})" if seq and signed.anchor_cut else
             f"after record #{seq}" if seq else "from its first record")
    if outcome.since is not None:
        later = _since(conn, database, chain_id, outcome.since, seq)
        if later is not None:
            seq, digest = later
            where = f"from {when(outcome.since)} (after record #{seq})"
    outcome.starts.append(f"{chain_id}: {where}")
    first: float | None = None
    start = seq
    for row in _records(conn, database, chain_id, seq):
        at, record_id, place, stored = row[2], row[1], int(row[0]), row[-1]
        name = f"chain {chain_id}: record #{place} (audit id {record_id}, {when(at)})"
        if place != seq + 1:
            outcome.fail(f"chain {chain_id}: record #{seq + 1} is missing (removed): the "
                         f"next is #{place} (audit id {record_id}, {when(at)})")
            return first
        digest = link(digest, chain_id, place, row[2:-1])
        if digest.hex() != stored:
            outcome.fail(f"{name} was changed, or inserted or moved here: its hash does not "
                         f"follow from its content and record #{place - 1}")
            return first
        expected = signed.heads.get(place)
        if expected is not None and expected[0] != stored:
            outcome.fail(f"{name} is not the record checkpoint #{expected[1]} signed: the "
                         f"records after #{max([s for s in signed.heads if s < place] or [start])}"
                         " were rewritten")
            return first
        seq = place
        outcome.records += 1
        if first is None:
            first = float(at)
    if seq < signed.last[0]:
        outcome.fail(f"chain {chain_id} ends at record #{seq}, but checkpoint #{signed.last[1]}"
                     f" ({when(signed.last[2])}) signed record #{signed.last[0]}: records "
                     f"#{seq + 1} to #{signed.last[0]} were removed (the tail was cut)")
    return first


def _since(conn: Any, database: db.Database, chain_id: str, since: float, after: int
           ) -> tuple[int, bytes] | None:
    """Where a chain starts for `--since`: the record before its first one at or after
    `since`, its stored hash taken as given (None: from the anchor, as without it)."""
    row = conn.execute(database.sql(
        "SELECT min(chain_seq) FROM audit WHERE chain_id = ? AND ts >= ? AND chain_seq > ?"),
        (chain_id, since, after)).fetchone()
    if row is None or row[0] is None or int(row[0]) <= after + 1:
        return None
    before = conn.execute(database.sql(
        "SELECT chain_seq, chain_hash FROM audit WHERE chain_id = ? AND chain_seq = ?"),
        (chain_id, int(row[0]) - 1)).fetchone()
    if before is None:
        return None  # (the gap is reported from the anchor)
    return int(before[0]), bytes.fromhex(before[1])


def _records(conn: Any, database: db.Database, chain_id: str, after: int
             ) -> Iterator[tuple[Any, ...]]:
    """(chain_seq, id, *COLUMNS, chain_hash) of a chain's records after `after`, in order."""
    text = database.sql(f"SELECT chain_seq, id, {', '.join(COLUMNS)}, chain_hash FROM audit "
                        f"WHERE chain_id = ? AND chain_seq > ? ORDER BY chain_seq LIMIT {PAGE}")
    while True:
        rows = conn.execute(text, (chain_id, after)).fetchall()
        yield from rows
        if len(rows) < PAGE:
            return
        after = int(rows[-1][0])


def _unchained(conn: Any, database: db.Database, first_ts: float | None,
               since: float | None, outcome: Outcome) -> None:
    """A record in no chain among those written since the chains' first verified record
    (with the chain on every record is in one): inserted, or written with the chain off."""
    if first_ts is None:
        return
    row = conn.execute(database.sql(
        "SELECT id, ts FROM audit WHERE chain_id IS NULL AND ts >= ? ORDER BY ts LIMIT 1"),
        (max(first_ts, since or first_ts),)).fetchone()
    if row is not None:
        outcome.fail(f"audit id {row[0]} ({when(float(row[1]))}) is in no chain, among records "
                     "written while the chain was on: inserted (or written with the chain "
                     "off: verify --since a time after it)")


def record(target: db.Target, outcome: Outcome, by: str, now: float | None = None) -> None:
    """The verification's outcome in `audit_verifications` (what `status` shows)."""
    cp = outcome.checkpoint
    with db.using(target) as database, database.lease() as conn:
        try:
            conn.execute(database.sql(
                "INSERT INTO audit_verifications (at, by_name, ok, detail, since, records, "
                "checkpoint_seq, checkpoint_at, checkpoint_hash) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                (time.time() if now is None else now, by, 1 if outcome.ok else 0,
                 outcome.detail, outcome.since, outcome.records,
                 cp.seq if cp else None, cp.at if cp else None, cp.hash if cp else None))
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
