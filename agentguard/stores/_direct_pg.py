"""Postgres for sync tools: a claim and a completion run in the caller's own thread, on a psycopg (sync)
connection of that thread — no hop to the guard's portal loop and back for each statement.

A shortcut beside the general path (asyncpg on the portal's loop) it must equal: the same server and session
settings (``application_name``, ``synchronous_commit``), the store's own statements (compiled from its
``Statements``: the read-or-claim function — or, for a likely first call, the plain claim it makes inside —
each with ``pg_claim_unsynced``'s ``set_config``, and the completion that announces watched records), the same
answers (``SQLStore.claim``, ``SQLStore.complete``); ``tests/test_direct_pg.py`` proves them equal. Bounded: at
most the store's pool capacity of connections across threads (a thread beyond it takes the general path);
those of threads that ended are closed on the next open, a forked child never uses its parent's. A failure
(connecting, a statement, a lost connection) is a ``StoreError`` as the store would raise it; the engine then
hands the call to the general path, which decides (retries, fails closed). Without psycopg, the general path
runs as ever.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import make_url

from .._errors import StoreError
from .._extras import missing
from .._fork import abandon
from ._claims import CLAIMING, READING
from ._schema import FENCE_AT, Record, record_from_row
from ._statements import Statements

Compiled = tuple[str, Callable[[dict[str, Any]], Sequence[Any]]]

CONNECT_TIMEOUT = 2  # seconds (libpq's least): a direct connection that cannot be had soon is not worth waiting for
RESTING = 1.0  # seconds without trying to connect again after a connection could not be opened
CLOSING_WAIT = 1.0  # seconds close() waits for a statement running on a connection of another thread


def available() -> bool:
    """Whether psycopg 3 is installed (the ``postgres`` extra brings it)."""
    return missing("psycopg") is None


def connect_kwargs(url: str, synchronous_commit: str | None) -> dict[str, Any] | None:
    """psycopg's connection parameters for the store's ``postgresql+asyncpg://`` URL, with the general path's
    session settings; None if the URL has query parameters (asyncpg's, which libpq may read otherwise)."""
    u = make_url(url)
    if u.query:
        return None
    kwargs: dict[str, Any] = {"host": u.host, "port": u.port, "user": u.username, "password": u.password,
                              "dbname": u.database}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    # As asyncpg's server_settings in _dialects.Postgres.engine_kwargs (the value is one of a checked few).
    kwargs.update(application_name="agentguard", connect_timeout=CONNECT_TIMEOUT, autocommit=True)
    if synchronous_commit:
        kwargs["options"] = f"-c synchronous_commit={synchronous_commit}"
    return kwargs


def _compiled(stmt: Any) -> Compiled:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    compiled = stmt.compile(dialect=PGDialect_psycopg(paramstyle="format"))  # type: ignore[no-untyped-call]
    names = tuple(compiled.positiontup or ())
    return compiled.string, lambda p: [p[n] for n in names]


class DirectPostgres:
    """The hot statements of one Postgres store, each on the calling thread's own psycopg connection."""

    def __init__(self, kwargs: dict[str, Any], capacity: int, sql: Statements,
                 error: Callable[[str, BaseException, bool | None], StoreError]) -> None:
        import psycopg

        self._psycopg = psycopg
        self._kwargs = kwargs
        self._capacity = capacity
        self._error = error
        assert sql.claim_or_fetch is not None  # (a Postgres store claims through its function)
        self._claim, self._insert, self._read, self._complete = (
            _compiled(s) for s in (sql.claim_or_fetch, sql.claim, sql.read, sql.complete))
        self._local = threading.local()
        self._conns: dict[threading.Thread, Any] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._resting_until = 0.0  # (monotonic) no new connection is tried before then

    def _conn(self, what: str, body_ran: bool) -> Any:
        """This thread's connection and its cursor (reused: a statement costs less), opened on first use; a
        ``StoreError`` if none may be had."""
        held = getattr(self._local, "conn", None)
        if held is not None and self._pid == os.getpid():
            return held
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook)
            self.after_fork()
        with self._lock:
            ended = [self._conns.pop(t) for t in [t for t in self._conns if not t.is_alive()]]
            full = len(self._conns) >= self._capacity
            resting = time.monotonic() < self._resting_until
            if not (full or resting):
                self._conns[threading.current_thread()] = None  # (its place, while it connects)
        for conn in ended:  # left by threads that ended
            if conn is not None:
                _close(conn)
        if full or resting:
            raise StoreError(f"the store failed ({what}: no direct connection for this thread now)",
                             body_ran=body_ran, transient=True)
        conn = None
        try:
            conn = self._psycopg.connect(**self._kwargs)
        except Exception as exc:
            self._resting_until = time.monotonic() + RESTING
            raise self._error(what, exc, body_ran) from exc
        finally:
            with self._lock:
                if conn is None:
                    self._conns.pop(threading.current_thread(), None)
                else:
                    self._conns[threading.current_thread()] = conn
        self._local.conn = held = (conn, conn.cursor())
        return held

    def after_fork(self) -> None:
        """In a forked child: the connections opened before the fork are neither used nor closed (closing one
        would end the parent's session on the socket both share), only abandoned (``_fork``); each thread
        opens its own."""
        abandon(self._conns, self._local)
        self._pid, self._local, self._conns = os.getpid(), threading.local(), {}
        self._lock = threading.Lock()  # (a lock held by another thread at the fork stays held in the child)

    def _fetch(self, what: str, compiled: Compiled, params: dict[str, Any], body_ran: bool) -> Any:
        """One statement on this thread's connection: its first row, or None."""
        conn, cur = self._conn(what, body_ran)
        sql, args = compiled
        try:
            cur.execute(sql, args(params))
            return cur.fetchone()
        except Exception as exc:
            if conn.closed:  # (killed, the server gone: psycopg marks it closed): the next call opens another
                self._drop(conn)
            raise self._error(what, exc, body_ran) from exc
        finally:
            if self._conns.get(threading.current_thread()) is not conn and not conn.closed:
                _close(conn)  # close() let it go while this statement ran (and could not wait): closed here

    def _drop(self, conn: Any) -> None:
        self._local.conn = None
        with self._lock:
            if self._conns.get(threading.current_thread()) is conn:
                del self._conns[threading.current_thread()]
        _close(conn)

    def claim(self, params: dict[str, Any], likely_taken: bool = False) -> int | Record | None:
        """What ``SQLStore.claim`` answers: our fence, the record there, or None (it vanished).

        Asked the cheaper of the store's two ways for what is likely: a replaying task's (an agent going over
        its history: ``Engine.replaying``) through the read-or-claim function, one round trip
        (``_claims.by_function``); any other through the plain claim, which costs the server about half the
        function's on a first call, and a read only if it found the key taken (``_claims.by_insert``). Both
        decide by the same ``INSERT ... ON CONFLICT DO NOTHING``."""
        if not likely_taken:
            row = self._fetch(CLAIMING, self._insert, params, False)
            if row is not None:
                return int(row[0])
            row = self._fetch(READING, self._read, params, False)
            return None if row is None else record_from_row(params["scope"], params["key"], row)
        row = self._fetch(CLAIMING, self._claim, params, False)
        if row is None:  # the record kept vanishing inside the function: read once more
            row = self._fetch(READING, self._read, params, False)
            return None if row is None else record_from_row(params["scope"], params["key"], row)
        if row[0] == 1:
            return int(row[1 + FENCE_AT])
        return record_from_row(params["scope"], params["key"], row[1:])

    def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                 audit: str | None = None) -> bool:
        """What ``SQLStore.complete`` answers: whether the outcome was recorded under our fence."""
        params = {"scope": scope, "key": key, "fence": fence, "state": state, "result": result,
                  "retention": retention, "audit": audit}
        return self._fetch("storing the result", self._complete, params, True) is not None

    def close(self) -> None:
        """Close every connection opened here (each thread opens a new one on its next call)."""
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook: the parent's, abandoned)
            self.after_fork()
        with self._lock:
            conns, self._conns = self._conns, {}
        self._local = threading.local()
        for conn in conns.values():
            if conn is not None:
                _close(conn)


def _close(conn: Any) -> None:
    """Close ``conn`` once no statement runs on it (psycopg's own lock, which a statement holds: closing under
    it would free what the statement uses). One still busy after a while is left to its thread, which closes it
    when its statement ends (``DirectPostgres._fetch``: the connection is no longer that thread's)."""
    if conn.lock.acquire(timeout=CLOSING_WAIT):
        try:
            conn.close()
        finally:
            conn.lock.release()
