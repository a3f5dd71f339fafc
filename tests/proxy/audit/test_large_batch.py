"""A batch's first try writes it whole, however large: on PostgreSQL the rows, the usage events
and the rollups go through one pipeline, and the rollups read back their key upsert's rows on a
cursor of their own (on the one that ran the rows' executemany, a fetch could be answered with
one of those INSERTs' results: "the last operation didn't produce records")."""

from __future__ import annotations

import time

from proxy.audit.commit import Committer
from proxy.audit.record import AuditRecord
from proxy.storage.db import Database
from tests import db_backends


def test_large_first_tries_are_written_whole() -> None:
    database = Database(db_backends.url())
    try:
        committer = Committer(database, 0.01, None)
        now = time.time()
        for lot in range(6):  # the failure came one time in two or three
            batch = [AuditRecord(endpoint="up", method=("tools/call", None)[i % 2],
                                 tool="echo", principal=f"p{i % 7}",
                                 request_id=f"r{lot}-{i}", ts=now - i)
                     for i in range(1200)]
            assert committer.attempt(batch, 1) is None
        with database.transaction() as conn:
            assert conn.execute("SELECT count(*) FROM audit").fetchone()[0] == 6 * 1200
    finally:
        committer.close()
        database.close()
