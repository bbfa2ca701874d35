"""A claim: one decision, asked of the database in one of three ways (the dialect picks, once, the way for a
key likely free and the way for a key likely taken: ``Dialect.claim``, ``Dialect.claim_taken``).

Whatever the way, a claim is decided by ``INSERT ... ON CONFLICT (scope, key) DO NOTHING`` — the row count
is the answer, never a check-then-insert — and answers the same: our fence if we claimed the key, else the
record that holds it, or None if that record vanished before it could be read (swept between the insert
and the read, or kept vanishing and reappearing): the caller claims again, a bounded number of times.

- :func:`by_insert`, the general way: insert; on a conflict, read. One statement for a first call (Postgres'
  first calls), two where the key is taken. On Postgres the insert is gathered with the other first calls of
  the loop that would wait for a connection, into one statement (``Executor.one``'s ``many``).
- :func:`in_one_hop` (SQLite, when aiosqlite can run a function on its thread): read, and insert only if
  nothing was read, in one hop to aiosqlite's thread.
- :func:`by_function` (Postgres, for a key likely taken): the read-or-claim function, one round trip.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from ._schema import FENCE_AT, Record, record_from_row
from ._statements import Many, Statements

CLAIMING = "claiming the key"
READING = "reading the record"

Claimed = int | Record | None


class RunsOne(Protocol):
    """The executor's hot path (``Executor.one``): one statement, its first row or None."""

    def __call__(
        self, what: str, stmt: Any, params: dict[str, Any], *, body_ran: bool | None = False, then: Any = None,
        many: Many | None = None,
    ) -> Awaitable[Any]: ...


class ClaimWay(Protocol):
    def __call__(self, one: RunsOne, sql: Statements, params: dict[str, Any]) -> Awaitable[Claimed]: ...


async def by_insert(one: RunsOne, sql: Statements, params: dict[str, Any]) -> Claimed:
    """The general way: the insert decides; on a conflict, a second statement reads the record there."""
    row = await one(CLAIMING, sql.claim, params, many=sql.claim_many)
    if row is not None:
        return int(row[0])
    return await _read(one, sql, params)


async def in_one_hop(one: RunsOne, sql: Statements, params: dict[str, Any]) -> Claimed:
    """SQLite's shortcut: the read, and the insert only if nothing was read, in one hop to aiosqlite's thread
    (``_aiosqlite.read_or_claim``). It saves the second hop of :func:`by_insert` and never takes SQLite's
    write lock on a replay. It must answer what :func:`by_insert` answers (tests/test_whitebox_store_layout.py)."""
    got = await one(CLAIMING, sql.read, params, then=sql.claim)
    if isinstance(got, int):
        return got
    return None if got is None else record_from_row(params["scope"], params["key"], got)


async def by_function(one: RunsOne, sql: Statements, params: dict[str, Any]) -> Claimed:
    """Postgres: the read-or-claim function (``_statements.claim_function_ddl``), one round trip; a replay
    costs about one SELECT. It must answer what :func:`by_insert` answers (tests/test_whitebox_store_layout.py)."""
    row = await one(CLAIMING, sql.claim_or_fetch, params)
    if row is None:  # the record kept vanishing inside the function: read once more
        return await _read(one, sql, params)
    if row[0] == 1:
        return int(row[1 + FENCE_AT])
    return record_from_row(params["scope"], params["key"], row[1:])


async def _read(one: RunsOne, sql: Statements, params: dict[str, Any]) -> Record | None:
    row = await one(READING, sql.read, params)
    return None if row is None else record_from_row(params["scope"], params["key"], row)
