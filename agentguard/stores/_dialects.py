"""The few places where SQLite and Postgres differ, named and kept small.

- the clock: always the database's, never the worker's, so leases and retention agree across machines;
- connection set-up: SQLite needs WAL and a busy timeout so several processes can share one file;
- schema creation under concurrency: Postgres serialises it with an advisory lock.
Both dialects share the upsert flavour (``INSERT ... ON CONFLICT (...) DO NOTHING RETURNING``), so claims
never need unique-violation detection.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    now: str  # SQL for "seconds since the epoch, as a double, from the database clock"
    schema_lock: str | None  # taken in the schema-creation transaction, if any


SQLITE = Dialect(
    name="sqlite",
    # julianday('now') has millisecond resolution and is fixed within one statement.
    now="((julianday('now') - 2440587.5) * 86400.0)",
    schema_lock=None,  # SQLite serialises DDL through its single writer lock
)

POSTGRES = Dialect(
    name="postgresql",
    # clock_timestamp(), not now(): now() is frozen at transaction start.
    now="(extract(epoch from clock_timestamp())::float8)",
    # Concurrent CREATE TABLE IF NOT EXISTS can still fail on pg_type's unique index; serialise it.
    schema_lock="SELECT pg_advisory_xact_lock(7283950271)",
)


def dialect_for(backend: str) -> Dialect:
    if backend == "sqlite":
        return SQLITE
    if backend == "postgresql":
        return POSTGRES
    raise ValueError(f"unsupported database backend {backend!r}: use sqlite+aiosqlite or postgresql+asyncpg")
