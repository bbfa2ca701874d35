"""SQLite for sync tools: a claim and a completion run in the caller's own thread, on a stdlib ``sqlite3``
connection of that thread — no hop to the guard's portal loop, none to an aiosqlite thread.

A shortcut beside the general path it must equal: the same file, the same pragmas, the same statements
(compiled from the store's own ``Statements``), the same read-or-claim (``_aiosqlite.read_or_claim``, with the
unsynced claim at ``synchronous=FULL``), the same answers (``SQLStore.claim`` and ``SQLStore.complete``);
``tests/test_direct.py`` proves them equal. A failure is a ``StoreError`` as the store would raise it; the
engine then hands the call to the general path, which decides (retries, fails closed). Statements block the
caller's thread only, as the sync tool itself does; SQLite's busy handler waits for a writer as on the
general path.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.engine import make_url

from .._errors import StoreError
from ._aiosqlite import BUSY_MS, read_or_claim, written
from ._schema import Record, record_from_row
from ._statements import Statements

Compiled = tuple[str, Callable[[dict[str, Any]], Sequence[Any]]]


def _compiled(stmt: Any) -> Compiled:
    compiled = stmt.compile(dialect=SQLiteDialect_aiosqlite())
    names = tuple(compiled.positiontup or ())
    getter = operator.itemgetter(*names) if len(names) > 1 else (lambda p: tuple(p[n] for n in names))
    return compiled.string, getter


class DirectSQLite:
    """The hot statements of one SQLite store, each on the calling thread's own connection."""

    def __init__(self, url: str, synchronous: str, sql: Statements, claim_unsynced: bool,
                 error: Callable[[str, BaseException, bool | None], StoreError]) -> None:
        self._cargs, self._cparams = SQLiteDialect_aiosqlite().create_connect_args(make_url(url))
        self._synchronous = synchronous.upper()
        self._claim_unsynced = claim_unsynced
        self._error = error
        self._read, self._claim, self._complete = _compiled(sql.read), _compiled(sql.claim), _compiled(sql.complete)
        self._local = threading.local()
        self._conns: dict[tuple[threading.Thread, str], sqlite3.Connection] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _conn(self, role: str = "conn", busy_ms: int = BUSY_MS) -> sqlite3.Connection:
        """This thread's connection for ``role`` (its own busy timeout), opened on first use."""
        held: sqlite3.Connection | None = getattr(self._local, role, None)
        if held is not None and self._pid == os.getpid():
            return held
        if self._pid != os.getpid():  # a forked child: never use (or close) a connection opened before the fork
            self._pid, self._local, self._conns = os.getpid(), threading.local(), {}
        # check_same_thread off only so that close() may close them all; each is used by its own thread.
        connect: Any = sqlite3.connect  # (its typed overloads do not take the dialect's parameters as a dict)
        conn: sqlite3.Connection = connect(*self._cargs, **{**self._cparams, "isolation_level": None,
                                                            "timeout": busy_ms / 1000})
        try:
            # The engine's pragmas (``_dialects.SQLite.set_up``); the file is in WAL mode already (the schema).
            conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except BaseException:
            conn.close()
            raise
        setattr(self._local, role, conn)
        with self._lock:
            for key in [k for k in self._conns if not k[0].is_alive()]:  # left by threads that ended
                self._conns.pop(key).close()
            self._conns[(threading.current_thread(), role)] = conn
        return conn

    def claim(self, params: dict[str, Any]) -> int | Record | None:
        """What ``SQLStore.claim`` answers: our fence, the record there, or None (it kept vanishing)."""
        (read_sql, read_args), (claim_sql, claim_args) = self._read, self._claim
        try:
            got = read_or_claim(self._conn(), read_sql, read_args(params), claim_sql, claim_args(params),
                                self._claim_unsynced)
        except (sqlite3.Error, OSError) as exc:
            raise self._error("claiming the key", exc, False) from exc
        if got is None or isinstance(got, int):
            return got
        return record_from_row(params["scope"], params["key"], got)

    def read_now(self, params: dict[str, Any]) -> Record | None:
        """The record there, read on this thread without waiting (an event loop's: an async tool's replay then
        costs no hop), or None if there is none or it could not be read at once — a read in WAL mode does not
        wait for SQLite's writer, and this connection's busy handler never waits."""
        sql, args = self._read
        try:
            rows = self._conn("reader", busy_ms=0).execute(sql, args(params)).fetchall()
        except (sqlite3.Error, OSError):
            return None
        return record_from_row(params["scope"], params["key"], rows[0]) if rows else None

    def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                 audit: str | None = None) -> bool:
        """What ``SQLStore.complete`` answers: whether the outcome was recorded under our fence."""
        sql, args = self._complete
        params = {"scope": scope, "key": key, "fence": fence, "state": state, "result": result,
                  "retention": retention, "audit": audit}
        try:
            rows = written(self._conn(), sql, args(params))
        except (sqlite3.Error, OSError) as exc:
            raise self._error("storing the result", exc, True) from exc
        return bool(rows)

    def close(self) -> None:
        """Close every connection opened here (each thread opens a new one on its next call)."""
        with self._lock:
            conns, self._conns = self._conns, {}
        self._local = threading.local()
        for conn in conns.values():
            conn.close()
