"""Postgres for sync tools: the store's statements in the caller's own thread, on a psycopg (sync) connection of
that thread — no hop to the guard's portal loop and back for each statement.

An executor of the same statements beside the general path (asyncpg on the portal's loop), never a decision of
its own: the same server and session settings (``application_name``, ``synchronous_commit``), the store's own
statements (compiled from its ``Statements`` for psycopg: the claim with ``pg_claim_unsynced``'s
``set_config``, the completion that announces watched records), its claim plans (``_claims``) and verbs
(``_verbs``), the same answers; ``tests/whitebox/test_executors.py`` proves them equal. Bounded: each connection takes a
slot of the worker's connection budget (``_budget``) when one is free now (a thread without one is refused, and
its caller asks the store, whose pool waits its turn); those of threads that ended are closed on the next open,
and every idle one as soon as callers wait for a slot; a forked child never uses its parent's. A failure
(connecting, a statement, a lost connection) is a ``StoreError`` as the store would raise it; the caller then
asks the store the same verb (the same statements, the same parameters, the same owner token), which decides
(retries, fails closed). Without psycopg, the general path runs as ever.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import make_url

from .._errors import StoreError
from .._extras import missing
from .._fork import abandon
from ._budget import Budget
from ._claims import Ask
from ._statements import Compiled, Statements, compiler
from ._verbs import Plans, SyncVerbs

CONNECT_TIMEOUT = 2  # seconds (libpq's least): a direct connection that cannot be had soon is not worth waiting for
RESTING = 1.0  # seconds without trying to connect again after a connection could not be opened
CLOSING_WAIT = 1.0  # seconds close() waits for a statement running on a connection of another thread


def available() -> bool:
    """Whether psycopg 3 is installed (the ``postgres`` extra brings it)."""
    return missing("psycopg") is None


def connect_kwargs(url: str, synchronous_commit: str | None, prepared: bool = True) -> dict[str, Any] | None:
    """psycopg's connection parameters for the store's ``postgresql+asyncpg://`` URL, with the general path's
    session settings; None if the URL has query parameters (asyncpg's, which libpq may read otherwise).
    ``prepared``: statements may be prepared (not through transaction pooling)."""
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
    if not prepared:  # (a statement prepared on one server session is unknown to the next one's)
        kwargs["prepare_threshold"] = None
    return kwargs


def psycopg_compiler() -> Callable[[Any], Compiled]:
    """The store's statements for psycopg (``%s`` placeholders)."""
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    return compiler(PGDialect_psycopg(paramstyle="format"))  # type: ignore[no-untyped-call]


class DirectPostgres(SyncVerbs):
    """The store's statements of one Postgres store, each on the calling thread's own psycopg connection (the
    ``Direct`` verbs)."""

    def __init__(self, kwargs: dict[str, Any], budget: Budget, sql: Statements, plans: Plans,
                 error: Callable[[str, BaseException, bool | None], StoreError]) -> None:
        import psycopg

        super().__init__(sql, plans)
        self._psycopg = psycopg
        self._kwargs = kwargs
        self._budget = budget
        budget.on_pressure(self)
        self._error = error
        self._compiled = psycopg_compiler()
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
            if not held[0].closed:
                return held
            self._local.conn = None  # (closed for the budget meanwhile: ``shed``)
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook)
            self.after_fork()
        self._close_ended()
        with self._lock:
            resting = time.monotonic() < self._resting_until
            full = resting or not self._budget.try_take()
            if not full:
                self._conns[threading.current_thread()] = None  # (its place, while it connects)
        if full:
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
                    self._budget.give()
                else:
                    self._conns[threading.current_thread()] = conn
                    self._budget.hold(conn)
        self._local.conn = held = (conn, conn.cursor())
        return held

    def _close_ended(self) -> None:
        """Close the connections of threads that ended."""
        with self._lock:
            ended = [self._conns.pop(t) for t in [t for t in self._conns if not t.is_alive()]]
        for conn in ended:
            if conn is not None:
                self._close(conn)

    def shed(self) -> None:
        """A caller waits for a slot of the budget: close every connection no statement runs on now (its thread
        opens another on its next call, or asks the store), and those of threads that ended."""
        self._close_ended()
        with self._lock:
            idle = [(t, c) for t, c in self._conns.items() if c is not None]
        for thread, conn in idle:
            if conn.lock.acquire(blocking=False):
                try:
                    with self._lock:
                        if self._conns.get(thread) is conn:
                            del self._conns[thread]
                    conn.close()
                finally:
                    conn.lock.release()
                self._budget.let_go(conn)

    def _close(self, conn: Any) -> None:
        if _close(conn):
            self._budget.let_go(conn)

    def after_fork(self) -> None:
        """In a forked child: the connections opened before the fork are neither used nor closed (closing one
        would end the parent's session on the socket both share), only abandoned (``_fork``); each thread
        opens its own."""
        abandon(self._conns, self._local)
        self._pid, self._local, self._conns = os.getpid(), threading.local(), {}
        self._lock = threading.Lock()  # (a lock held by another thread at the fork stays held in the child)

    def _fetch(self, ask: Ask, params: dict[str, Any]) -> Any:
        """``ask`` on this thread's connection: its first row, or None."""
        what, body_ran = ask.what, bool(ask.body_ran)
        conn, cur = self._conn(what, body_ran)
        sql, args = self._compiled(ask.stmt)
        try:
            cur.execute(sql, args(params))
            return cur.fetchone()
        except Exception as exc:
            if conn.closed:  # (killed, the server gone: psycopg marks it closed): the next call opens another
                self._drop(conn)
            raise self._error(what, exc, body_ran) from exc
        finally:
            if self._conns.get(threading.current_thread()) is not conn and not conn.closed:
                self._close(conn)  # close() let it go while this statement ran (and could not wait): closed here
            elif self._budget.shedding and not conn.closed:  # callers wait for a slot: this one is theirs
                self._drop(conn)

    def _drop(self, conn: Any) -> None:
        self._local.conn = None
        with self._lock:
            if self._conns.get(threading.current_thread()) is conn:
                del self._conns[threading.current_thread()]
        self._close(conn)

    def close(self) -> None:
        """Close every connection opened here (each thread opens a new one on its next call)."""
        if self._pid != os.getpid():  # (forked by a way that ran no at-fork hook: the parent's, abandoned)
            self.after_fork()
        with self._lock:
            conns, self._conns = self._conns, {}
        self._local = threading.local()
        for conn in conns.values():
            if conn is not None:
                self._close(conn)


def _close(conn: Any) -> bool:
    """Close ``conn`` once no statement runs on it (psycopg's own lock, which a statement holds: closing under
    it would free what the statement uses); whether it closed. One still busy after a while is left to its
    thread, which closes it when its statement ends (``DirectPostgres._fetch``: the connection is no longer
    that thread's)."""
    if conn.lock.acquire(timeout=CLOSING_WAIT):
        try:
            conn.close()
        finally:
            conn.lock.release()
        return True
    return False
