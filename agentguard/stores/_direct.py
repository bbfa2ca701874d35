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
from ._aiosqlite import read_or_claim
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
        self._conns: dict[threading.Thread, sqlite3.Connection] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _conn(self) -> sqlite3.Connection:
        held: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if held is not None and self._pid == os.getpid():
            return held
        if self._pid != os.getpid():  # a forked child: never use (or close) a connection opened before the fork
            self._pid, self._local, self._conns = os.getpid(), threading.local(), {}
        # check_same_thread off only so that close() may close them all; each is used by its own thread.
        connect: Any = sqlite3.connect  # (its typed overloads do not take the dialect's parameters as a dict)
        conn: sqlite3.Connection = connect(*self._cargs, **{**self._cparams, "isolation_level": None, "timeout": 30.0})
        try:
            # The engine's pragmas (``_dialects.SQLite.set_up``); the file is in WAL mode already (the schema).
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except BaseException:
            conn.close()
            raise
        self._local.conn = conn
        with self._lock:
            for thread in [t for t in self._conns if not t.is_alive()]:  # left by threads that ended
                self._conns.pop(thread).close()
            self._conns[threading.current_thread()] = conn
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

    def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                 audit: str | None = None) -> bool:
        """What ``SQLStore.complete`` answers: whether the outcome was recorded under our fence."""
        sql, args = self._complete
        params = {"scope": scope, "key": key, "fence": fence, "state": state, "result": result,
                  "retention": retention, "audit": audit}
        try:
            rows = self._conn().execute(sql, args(params)).fetchall()  # fetch all: the statement ends, it commits
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
