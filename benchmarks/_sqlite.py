"""SQLite (WAL, ``synchronous=OFF`` so thread hops and CPU show rather than fsync): one caller."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite

from . import _common as c
from . import _seq
from ._harness import Stat

Log = Callable[[str], None]
SYNCHRONOUS = "OFF"


def _pragmas(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")


class RawSqlite3:
    """stdlib sqlite3 in the caller's thread (no hop at all): the reference below every async layer."""

    label = "sqlite3 (stdlib, no thread hop)"

    def __init__(self, path: Path, st: c.Statements) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        _pragmas(self.conn)
        self.st = st

    async def claim(self, p: dict[str, Any]) -> Any:
        rows = self.conn.execute(self.st.claim, p).fetchall()
        return rows[0][0] if rows else None

    async def complete(self, p: dict[str, Any]) -> Any:
        return self.conn.execute(self.st.complete, p).fetchall()

    async def read(self, p: dict[str, Any]) -> Any:
        rows = self.conn.execute(self.st.read, p).fetchall()
        return rows[0] if rows else None

    async def close(self) -> None:
        self.conn.close()


class RawAiosqlite:
    """aiosqlite, lean: one thread hop per statement (``execute_fetchall``), autocommit."""

    label = "aiosqlite"

    def __init__(self, conn: aiosqlite.Connection, st: c.Statements) -> None:
        self.conn, self.st = conn, st

    @classmethod
    async def connect(cls, path: Path, st: c.Statements) -> RawAiosqlite:
        conn = await aiosqlite.connect(path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        for pragma in ("busy_timeout = 30000", "journal_mode = WAL", f"synchronous = {SYNCHRONOUS}"):
            await conn.execute_fetchall(f"PRAGMA {pragma}")
        return cls(conn, st)

    async def claim(self, p: dict[str, Any]) -> Any:
        rows = list(await self.conn.execute_fetchall(self.st.claim, p))
        return rows[0][0] if rows else None

    async def complete(self, p: dict[str, Any]) -> Any:
        return await self.conn.execute_fetchall(self.st.complete, p)

    async def read(self, p: dict[str, Any]) -> Any:
        rows = list(await self.conn.execute_fetchall(self.st.read, p))
        return rows[0] if rows else None

    async def close(self) -> None:
        await self.conn.close()


def _forget(path: Path) -> Callable[[str], Awaitable[None]]:
    async def forget(task_id: str) -> None:
        with sqlite3.connect(path, isolation_level=None) as conn:
            conn.execute("DELETE FROM agentguard_calls WHERE task_id = ?", (task_id,))

    return forget


def url_of(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


async def observe(path: Path) -> c.Observed:
    return await c.observe(url_of(path), sqlite_synchronous=SYNCHRONOUS)


async def sequential(
    path: Path, obs: c.Observed, *, n: int, reps: int, warmup: int, log: Log
) -> tuple[dict[str, Stat], list[str]]:
    url = url_of(path)
    st = c.store_statements(url)
    raws: list[_seq.Raw] = [await RawAiosqlite.connect(path, st), RawSqlite3(path, st)]
    return await _seq.sequential(url, raws, rp=obs.params, guard_kw={"sqlite_synchronous": SYNCHRONOUS},
                                 forget=_forget(path), n=n, reps=reps, warmup=warmup, log=log)
