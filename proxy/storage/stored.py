"""A table of named JSON specs that every gateway on the database shares: the rows of
`/api/v1/servers` (proxy.servers) and `/api/v1/endpoints` (proxy.virtual.registry). Each
table has a `<table>_version` counter its triggers bump (proxy.storage.migrations), which the gateways
poll to learn that another one wrote. Blocking: called on the registries' own thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson
from pydantic import BaseModel

from proxy.errors import Conflict, NotFound
from proxy.storage import db

log = logging.getLogger("tollhouse.stored")

SpecT = TypeVar("SpecT", bound=BaseModel)


class StoredSpecs(Generic[SpecT]):
    def __init__(self, database: db.Database, table: str, model: type[SpecT],
                 noun: str) -> None:
        self._database = database
        self._table = table  # a constant of ours, never input
        self._model = model
        self._noun = noun

    def read_all(self, skip: Callable[[str], bool]) -> tuple[int, dict[str, SpecT]]:
        """The counter and every valid row whose name `skip` does not claim (the config
        file's); an invalid row is logged and left out."""
        sql, table = self._database.sql, self._table
        with self._database.transaction() as conn:
            version = conn.execute(sql(f"SELECT version FROM {table}_version WHERE id = 1"),
                                   ()).fetchone()
            rows = conn.execute(sql(f"SELECT name, spec FROM {table}"), ()).fetchall()
        found = {}
        for name, spec in rows:
            if skip(name):
                continue  # the config file wins over a row of the same name
            try:
                found[name] = self._model.model_validate(orjson.loads(spec))
            except (ValueError, TypeError) as exc:
                log.error("%s %r in the database is not valid (%s); it is not served",
                          self._noun, name, exc)
        return (int(version[0]) if version else 0), found

    def read_version(self) -> int:
        with self._database.transaction() as conn:
            row = conn.execute(self._database.sql(f"SELECT version FROM {self._table}_version "
                                                  "WHERE id = 1"), ()).fetchone()
        return int(row[0]) if row else 0

    def insert(self, name: str, spec: SpecT) -> SpecT:
        now = time.time()
        try:
            with self._database.transaction() as conn:
                conn.execute(self._database.sql(
                    f"INSERT INTO {self._table} (name, spec, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?)"), (name, spec.model_dump_json(), now, now))
        except self._database.integrity_errors:
            raise Conflict(f"{self._noun} '{name}' already exists") from None
        return spec

    def update(self, name: str, change: Callable[[SpecT], SpecT]) -> SpecT:
        """`change` applied to the stored row, read and written in one transaction."""
        sql, table = self._database.sql, self._table
        lock = " FOR UPDATE" if self._database.postgresql else ""
        with self._database.transaction() as conn:
            if not self._database.postgresql:  # take the write lock before reading (WAL:
                conn.execute("BEGIN IMMEDIATE")  # else a stale snapshot fails the write)
            row = conn.execute(sql(f"SELECT spec FROM {table} WHERE name = ?{lock}"),
                               (name,)).fetchone()
            if row is None:
                raise NotFound(f"{self._noun} '{name}' not found")
            spec = change(self._model.model_validate(orjson.loads(row[0])))
            conn.execute(sql(f"UPDATE {table} SET spec = ?, updated_at = ? WHERE name = ?"),
                         (spec.model_dump_json(), time.time(), name))
        return spec

    def delete(self, name: str, check: Callable[[Any], None] | None = None) -> None:
        """`check(conn)` first, in the same transaction: it raises to refuse."""
        with self._database.transaction() as conn:
            if check is not None:
                check(conn)
            cur = conn.execute(self._database.sql(f"DELETE FROM {self._table} WHERE name = ?"),
                               (name,))
            if cur.rowcount != 1:
                raise NotFound(f"{self._noun} '{name}' not found")
