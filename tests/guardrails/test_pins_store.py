"""The pins in the database (migration 14): what one process decided is what the next one
starts from, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from proxy.pin_store import DatabasePins
from proxy.storage.db import Database
from tests import db_backends

TOOL = {"name": "t", "description": "first", "inputSchema": {"type": "object"}}


async def test_pins_survive_a_restart() -> None:
    database = Database(db_backends.url())
    try:
        store = DatabasePins(database)
        pins = store.pins
        assert pins.verdict("e", TOOL) == "new"
        changed = {**TOOL, "description": "second: ünïcode"}
        assert pins.verdict("e", changed) == "changed"
        await store.aclose()

        second = DatabasePins(database)
        again = second.pins  # a new process reads what the first wrote
        [pending] = again.pending()
        assert (pending.endpoint, pending.name) == ("e", "t")
        assert pending.definition == TOOL and pending.pending_definition == changed
        assert again.verdict("e", TOOL) == "same"  # changed back: nothing waits any more
        await second.aclose()
        third = DatabasePins(database)
        assert third.pins.pending() == []
        await third.aclose()
    finally:
        database.close()
