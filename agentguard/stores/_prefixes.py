"""The keys and tasks that start with what a person typed (``agentguard show ag_3f2``): a record's, or one the
ledger still names after its record is gone.

Read-only, off the hot path, through the executor's general path like ``_console``. ``substr(col, 1, n) = :p``
compares characters exactly on SQLite and Postgres alike (``LIKE`` would read ``_``, which every key holds,
as a wildcard). A full scan: these serve a command a person types, never a tool call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ._attempts import ATTEMPTS, KEYS
from ._schema import TABLE

if TYPE_CHECKING:
    from ._store import SQLStore


async def keys(store: SQLStore, prefix: str, *, scope: str | None, limit: int) -> list[tuple[str, str, str, str]]:
    """Up to ``limit`` keys that start with ``prefix``, as (key, scope, task id, operation), by key: those with a
    record, and those whose record is gone that the ledger still names (``KEYS``: operation ``""``)."""
    where, gone_where = (" AND scope = :scope", " AND k.scope = :scope") if scope is not None else ("", "")
    stmt = text(
        f"SELECT key, scope, task_id, operation FROM {TABLE} WHERE substr(key, 1, :n) = :prefix{where}"
        f" UNION ALL SELECT k.key, k.scope, k.task_id, '' FROM {KEYS} k WHERE substr(k.key, 1, :n) = :prefix"
        f"{gone_where} AND NOT EXISTS (SELECT 1 FROM {TABLE} c WHERE c.scope = k.scope AND c.key = k.key)"
        " ORDER BY 1, 2 LIMIT :limit"
    )

    async def run(conn: AsyncConnection) -> list[tuple[str, str, str, str]]:
        rows = await conn.execute(stmt, {"n": len(prefix), "prefix": prefix, "scope": scope, "limit": limit})
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    return await store._executor.run("looking up keys", run, body_ran=None)


async def tasks(store: SQLStore, prefix: str, *, scope: str | None, limit: int) -> list[tuple[str, str]]:
    """Up to ``limit`` tasks whose id starts with ``prefix``, as (task id, scope), by task id: those with a
    record, and those only the ledger of attempts still names."""
    where = " AND scope = :scope" if scope is not None else ""
    stmt = text(
        f"SELECT task_id, scope FROM {TABLE} WHERE substr(task_id, 1, :n) = :prefix{where}"
        f" UNION SELECT task_id, scope FROM {ATTEMPTS} WHERE substr(task_id, 1, :n) = :prefix{where}"
        " ORDER BY 1, 2 LIMIT :limit"
    )

    async def run(conn: AsyncConnection) -> list[tuple[str, str]]:
        rows = await conn.execute(stmt, {"n": len(prefix), "prefix": prefix, "scope": scope, "limit": limit})
        return [(r[0], r[1]) for r in rows]

    return await store._executor.run("looking up tasks", run, body_ran=None)
