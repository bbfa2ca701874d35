"""``SQLStore``: one SQLAlchemy Core async store for ``sqlite+aiosqlite`` and ``postgresql+asyncpg``.

Every hot statement is written once (``_statements``), compiled once per dialect and executed in autocommit
mode: one statement, one round trip, one commit. No connection is held while a tool body runs. Every write
after the claim is conditional on the fence the caller holds. What differs between the two databases is the
dialect's (``_dialects``); how statements run, and fail, is the executor's (``_executor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._fork import on_fork
from .._redact import redact_url
from . import _attempts
from ._attempts import UNCHAINED_REPLACEMENT, Attempt, AttemptLedger, RecordDetail
from ._chain import ChainCheck
from ._claims import Ask, Claimed
from ._decisions import Decided, How, decide
from ._dialects import Postgres, SQLite, dialect_for
from ._direct import DirectSQLite, NotNow
from ._direct_pg import DirectPostgres, available, connect_kwargs
from ._engines import Engines
from ._executor import Executor
from ._listen import News
from ._schema import (
    DONE,
    TASK_REPLACEMENT,
    Listing,
    Record,
    Replacement,
    create_schema,
    listing_from_row,
)
from ._server import prepare, replace_index
from ._statements import WATCHED_DDL, Statements
from ._sweep import paced
from ._verbs import (
    asks,
    complete_params,
    key_params,
    record,
    release_owned_params,
    release_params,
    renew_params,
    took,
)

if TYPE_CHECKING:
    from ._protocols import LedgerStore, Store

log = logging.getLogger("agentguard.store")
T = TypeVar("T")

# Postgres compiles a query to machine code (JIT) when its planner's estimate passes a threshold, which a scan
# of every record passes on a large store: on 420,000 records the held queue's read took 0.94 s, 0.77 s of it
# compiling a plan that ran in 0.17 s. A person's reads are never worth it: they run without.
NO_JIT = text("SET LOCAL jit = off")

STEP = "recording a step"


# The indexes a store made by an earlier version has, each with the one that replaces it (``agentguard migrate``).
REPLACEMENTS = (TASK_REPLACEMENT, UNCHAINED_REPLACEMENT)


async def _replace_on_sqlite(conn: AsyncConnection, index: Replacement) -> bool:
    names = {row[0] for row in await conn.exec_driver_sql(
        f"SELECT name FROM sqlite_master WHERE name IN ('{index.name}', '{index.old}')")}
    if names == {index.name}:
        return False
    for ddl in index.ddl():
        await conn.exec_driver_sql(ddl)
    return True


class SQLStore:
    """The store (implements ``ClaimStore``, ``StepStore``, ``AdminStore`` and ``LedgerStore``). Engines are
    made lazily, one per event loop; the schema is created on first use."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        max_connections: int | None = None,
        connect_timeout: float = 10.0,
        sqlite_synchronous: str = "FULL",
        pg_synchronous_commit: str | None = None,
        pg_claim_unsynced: bool = False,
        clock: str | None = None,
    ) -> None:
        # clock: a test seam, off by default (see _dialects.Options.clock)
        self.dialect = dialect_for(url, pool_size=pool_size, max_connections=max_connections,
                                   connect_timeout=connect_timeout,
                                   sqlite_synchronous=sqlite_synchronous,
                                   pg_synchronous_commit=pg_synchronous_commit, pg_claim_unsynced=pg_claim_unsynced,
                                   clock=clock)
        self.url = self.dialect.url
        self.backend = self.dialect.name
        self.memory = self.dialect.memory
        self.read_is_cheaper = self.dialect.read_is_cheaper
        self.sql = Statements(self.dialect.now, announce=self.dialect.channel if self.dialect.announces else None,
                              unsynced_claim=self.dialect.unsynced_in_statement, gather=self.dialect.gathers,
                              row_id=self.dialect.row_id, rows_by_id=self.dialect.rows_by_id,
                              greatest=self.dialect.greatest)
        self.announces = self.dialect.announces
        self._executor = Executor(self.dialect, self._create)
        self.ledger = AttemptLedger(self._executor)  # the ledger of attempts' verbs (below: ``LedgerStore``)
        self._engines: Engines = self._executor.engines
        self._asks = asks(self.sql)  # the hot statements, as every executor's verbs ask them (``_verbs``)
        self._plans = self.dialect.plans
        # The door every hot statement passes through.
        self._one = self._executor.one
        self._direct: DirectSQLite | DirectPostgres | None = None
        self._no_direct = False  # (Postgres: no psycopg, or a URL it cannot be given)
        self._making_direct = threading.Lock()
        self._reads_here = self.dialect.name == "sqlite" and not self.dialect.memory  # (see claim)
        on_fork(self)

    def after_fork(self) -> None:
        """In a forked child: engines, pools and connections of its own from the next statement on; the parent's
        are abandoned, never closed (``_fork``). An in-memory database stays the parent's: the child refuses."""
        direct = self._direct
        shared = self.backend == "sqlite" and not self.memory and (
            self._engines.connected() or (isinstance(direct, DirectSQLite) and direct.connected()))
        refusal = None
        if shared:
            # SQLite keeps its file locks per process, and the child inherits its parent's account of them: its
            # own connections would take no lock the parent held at the fork, and the parent closing its last
            # connection could remove the write-ahead log under the child, losing its records (and with them the
            # replays that keep a body from running twice). Fail closed (tests/core/test_fork.py: the refusal, the
            # cure).
            refusal = (f"this process was forked from process {os.getppid()} while that process had the SQLite store "
                       f"{redact_url(self.url)} open, and SQLite cannot tell the two processes' locks apart: its "
                       "writes here could be lost. Close the guard before forking (Guard.close(); it reopens on its "
                       "next call), or use Postgres")
            log.error("%s", refusal)
        self._executor.after_fork(refusal)
        if direct is not None:
            direct.after_fork()
        self._making_direct = threading.Lock()  # (a lock held by another thread at the fork stays held here)
        if shared:  # (a sync tool's claims in its own thread too: they take the general path, which refuses)
            self._direct, self._no_direct = None, True
        if self.dialect.waiters is not None:
            self.dialect.waiters.after_fork()

    # -- lifecycle ------------------------------------------------------------------------------------

    def engine(self) -> AsyncEngine:
        """The running loop's engine: for running SQL on the store's own database (tests, admin tools)."""
        return self._engines.engine()

    async def ensure_schema(self) -> None:
        """Create the tables if missing; safe when many processes start at once."""
        await self._executor.ensure_schema()

    async def _create(self, conn: AsyncConnection) -> None:
        d = self.dialect
        upgrade = functools.partial(_attempts.upgrade, sqlite=d.name == "sqlite")
        if d.name == "postgresql":
            await prepare(conn, d.schema_begin, d.schema_lock, [WATCHED_DDL], upgrade)
        else:
            await create_schema(conn, d.schema_begin, d.schema_lock, [], upgrade)

    async def replace_indexes(self) -> list[Replacement]:
        """The indexes an earlier version made that this one replaces (``REPLACEMENTS``): each new one built and
        the old one dropped (``agentguard migrate``), never when a guard opens the store: a build that blocks
        writes would hold every writer for as long as it takes (on SQLite, every worker's claims and completions).
        Postgres builds each without blocking writes (``_server.replace_index``); SQLite under its write lock.
        Those replaced (none on a store made by this version)."""
        done = []
        for index in REPLACEMENTS:
            replace = replace_index if self.dialect.name == "postgresql" else _replace_on_sqlite
            replaced = await self._executor.run(f"replacing {index.what}", functools.partial(replace, index=index),
                                                body_ran=None)
            if replaced:
                done.append(index)
        return done

    async def dispose(self) -> None:
        """Dispose the engine of the running loop (and the sync tools' own connections, reopened on use)."""
        if self._direct is not None:
            self._direct.close()
        await self._engines.dispose()

    def dispose_soon(self, skip: asyncio.AbstractEventLoop | None = None) -> None:
        """From any thread, waiting for nothing: each loop but ``skip`` disposes its engine as soon as it runs (the
        store of a guard collected unclosed)."""
        self._engines.dispose_soon(skip)

    def direct(self) -> DirectSQLite | DirectPostgres | None:
        """For sync tools, the hot verbs in the caller's thread (``_protocols.Direct``), once the schema is made: a
        SQLite file store's (``_direct``), or a Postgres store's where psycopg is installed (``_direct_pg``); else
        None (the general path). Each verb asks the statements this store's own verb asks, with the same
        parameters, and answers the same; a failure raises ``StoreError``, and the same verb of this store may
        then be asked instead."""
        if self._direct is None:
            d = self.dialect
            if d.memory or self._no_direct or not self._executor.schema_ready:
                return None
            # One executor, however many threads come at once: each made its own, with a cap of its own, and a
            # new guard's first thousand sync calls opened hundreds of connections (tests/core/test_storm.py).
            with self._making_direct:
                if self._direct is None and not self._no_direct:
                    if isinstance(d, SQLite):
                        self._direct = DirectSQLite(self.url, d.options.sqlite_synchronous, self.sql, self._plans,
                                                    d.compiled, d.claim_unsynced, self._executor.error, d.waiters)
                    else:
                        assert isinstance(d, Postgres)
                        # (behind session pooling a psycopg connection could wait for a server session without
                        # end: sync tools' statements go to the pool, whose connections are given a bounded wait)
                        kwargs = (connect_kwargs(self.url, d.options.pg_synchronous_commit, d.keeps_statements)
                                  if available() and d.pooling != "session" else None)
                        if kwargs is None:
                            self._no_direct = True
                        else:
                            self._direct = DirectPostgres(kwargs, d.budget, self.sql, self._plans,
                                                          self._executor.error)
        return self._direct

    # -- a call's verbs ------------------------------------------------------------------------------------

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Claimed:
        """Claim the key (INSERT ... ON CONFLICT DO NOTHING: the row count decides) by the dialect's plan for what
        is likely (``_claims``; ``likely_taken``: the key is held or done already, so it is read first). On a
        SQLite file, the plan runs on this loop's own thread as far as it can be made at once (a read, and an
        insert that neither waits nor syncs: ``_direct.DirectSQLite.now``); the rest, from the statement it
        stopped at, on the general path.

        Returns our fence if we claimed it, else the existing record, or None if that record is not
        visible (it vanished, or a racing insert committed after our snapshot): the caller claims again.
        """
        a = self._asks
        plan = (self._plans.taken if likely_taken else self._plans.free)(a.read, a.claim, params)
        direct = self._direct
        if direct is None and self._reads_here:
            if not self._executor.schema_ready:  # (the first callers wait for it together, then all go at once)
                await self._executor.ensure_schema()
            direct = self.direct()
        if isinstance(direct, DirectSQLite):
            # Its reads first, with no place in the loop's line of writers (a read never waits for the writer): a
            # record there answers, as a replay's does, with no write. A write takes its turn.
            if direct.advance_now(plan, reads=True) is plan and plan.ask is None:
                return plan.answer
            made = await direct.at_once(lambda: direct.advance_now(plan))
            if isinstance(made, NotNow):
                return await direct.hop(made, lambda: self._executor.claim(plan))
            if isinstance(plan.answer, int):
                # A first call lets the loop's other tasks run once, as a claim that hops does: callers
                # whose bodies never suspend take turns. (Cancelled here, the engine releases the claim.)
                await asyncio.sleep(0)
            return plan.answer
        return await self._executor.claim(plan)

    def _ask(self, ask: Ask, params: dict[str, Any]) -> Any:
        return self._one(ask.what, ask.stmt, params, body_ran=ask.body_ran, writes=ask.writes, many=ask.many)

    async def read(self, scope: str, key: str) -> Record | None:
        return record(scope, key, await self._ask(self._asks.read, key_params(scope, key)))

    async def take_over(self, params: dict[str, Any]) -> tuple[int, int] | None:
        """Returns (fence, origin) if we took the claim over."""
        return took(await self._ask(self._asks.take_over, params))

    async def renew(self, scope: str, key: str, fence: int, lease: float) -> bool:
        return await self._ask(self._asks.renew, renew_params(scope, key, fence, lease)) is not None

    async def complete(
        self, scope: str, key: str, fence: int, state: str, result: str, retention: float, audit: str | None = None
    ) -> bool:
        params = complete_params(scope, key, fence, state, result, retention, audit)
        direct = self._direct
        if isinstance(direct, DirectSQLite) and direct.completes_now:  # at once on this loop's thread (no hop)
            done = await direct.at_once(lambda: direct.now(self._asks.complete, params))
            if isinstance(done, NotNow):
                done = await direct.hop(done, lambda: self._ask(self._asks.complete, params))
            return done is not None
        return await self._ask(self._asks.complete, params) is not None

    async def release_owned(self, scope: str, key: str, owner: str, retention: float) -> bool:
        """Release the claim a cancelled claimer may or may not have won, recognised by its owner token."""
        params = release_owned_params(scope, key, owner, retention)
        return await self._ask(self._asks.release_owned, params) is not None

    async def release(self, scope: str, key: str, fence: int, retention: float, audit: str | None = None, *,
                      raised: str | None = None, bound: bool = True) -> bool:
        params = release_params(scope, key, fence, retention, audit, raised, bound)
        return await self._ask(self._asks.release, params) is not None

    # -- waiting on another process's claim (where the store ``announces``) ------------------------------

    def listening(self) -> int:
        """The running loop's listener generation: > 0 while it listens (0 where the store announces nothing)."""
        return self._engines.listening() if self.announces else 0

    async def watch(self, scope: str, key: str, news: News) -> int:
        """Listen for the outcome of ``(scope, key)``, which another caller is running: news of it goes to
        ``news``. Returns the listener's generation (> 0) once the record is marked watched; 0 if the record
        is no longer running (look again now); -1 if nothing can be listened to here (poll)."""
        if not self.announces or self.sql.watch is None or not getattr(self.dialect, "listens", True):
            return -1  # (nothing to listen to; behind transaction pooling, nothing a listener could hear)
        listener = self._engines.listener()
        listener.subscribe(news)
        generation = await listener.up()  # listening before the mark: an announcement cannot slip between
        if not generation:
            return -1
        marked = await self._one("watching the record", self.sql.watch, {"scope": scope, "key": key}, body_ran=None)
        return generation if marked is not None else 0

    # -- steps ---------------------------------------------------------------------------------------------

    async def load_steps(self, scope: str, key: str, origin: int) -> list[tuple[str, int, str, str | None]]:
        async def run(conn: AsyncConnection) -> list[tuple[str, int, str, str | None]]:
            rows = await conn.execute(self.sql.load_steps, {"scope": scope, "key": key, "origin": origin})
            return [(r[0], int(r[1]), r[2], r[3]) for r in rows]

        return await self._executor.run("loading the recorded steps", run, body_ran=False)

    async def put_step(
        self, scope: str, key: str, *, fence: int, origin: int, lease: float, name: str, seq: int, state: str,
        result: str | None,
    ) -> bool:
        step = {"scope": scope, "key": key, "origin": origin, "name": name, "seq": seq, "state": state,
                "fence": fence, "result": result}
        return await self._fenced_write(self.sql.put_step, step, lease)

    async def clear_step(self, scope: str, key: str, *, fence: int, origin: int, lease: float, name: str) -> bool:
        step = {"scope": scope, "key": key, "origin": origin, "name": name, "fence": fence}
        return await self._fenced_write(self.sql.clear_step, step, lease)

    async def _fenced_write(self, stmt: Any, step: dict[str, Any], lease: float) -> bool:
        """``stmt`` in a transaction that first re-checks (locks, renews) the claim; False if it is not ours."""

        async def run(conn: AsyncConnection) -> bool:
            check = {"scope": step["scope"], "key": step["key"], "fence": step["fence"], "lease": lease}
            if (await conn.execute(self.sql.fence_check, check)).first() is None:
                return False
            await conn.execute(stmt, step)
            return True

        return await self._executor.run(STEP, run, body_ran=True, transaction=True)

    @contextlib.asynccontextmanager
    async def step_transaction(
        self, scope: str, key: str, *, fence: int, origin: int, lease: float, name: str, seq: int,
    ) -> AsyncIterator[_StepTransaction | None]:
        async with self._fenced(scope, key, fence, lease) as conn:
            step = {"scope": scope, "key": key, "origin": origin, "name": name, "seq": seq, "fence": fence}
            yield None if conn is None else _StepTransaction(self, conn, step)

    @contextlib.asynccontextmanager
    async def _fenced(self, scope: str, key: str, fence: int, lease: float) -> AsyncIterator[AsyncConnection | None]:
        """A transaction that starts by re-checking (and locking, and renewing) our claim; None, having opened
        nothing durable, if the claim is no longer ours."""
        async with self._executor.transaction(STEP, body_ran=True) as conn:
            check = {"scope": scope, "key": key, "fence": fence, "lease": lease}
            found = await self._executor.execute(STEP, conn, self.sql.fence_check, check, body_ran=True)
            yield None if found.first() is None else conn

    # -- an operator's verbs -------------------------------------------------------------------------------

    async def person_read(self, what: str, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``fn`` on a connection of the store's, as a person's read (``agentguard ls --unknown``, the console's
        pages: ``_console``), off the hot path; on Postgres without JIT (``NO_JIT``)."""
        if self.dialect.name != "postgresql":
            return await self._executor.run(what, fn, body_ran=None)

        async def run(conn: AsyncConnection) -> T:
            await conn.execute(NO_JIT)
            return await fn(conn)

        return await self._executor.run(what, run, body_ran=None, transaction=True)

    async def unknown(self, *, scope: str | None = None, limit: int = 100, offset: int = 0) -> list[tuple[Any, ...]]:
        params = {"scope": scope, "limit": limit, "offset": offset}

        async def run(conn: AsyncConnection) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await conn.execute(self.sql.unknown, params)]

        return await self.person_read("listing unknown outcomes", run)

    async def decide(self, scope: str, key: str, how: How, value: str | None, retention: float, *,
                     seen: str | None = None) -> Decided:
        """A person's decision on a held (or abandoned) record, made only on the revision ``seen`` if given
        (``_decisions``)."""
        return await decide(self._executor, self.sql, scope, key, how, value, retention, seen=seen)

    async def resolve_step(self, scope: str, key: str, name: str, state: str | None, result: str | None) -> bool:
        """Settle a started step: record it done with ``result``, or (state None) clear it for a retry."""
        params: dict[str, str | None] = {"scope": scope, "key": key, "name": name}
        if state is None:
            stmt = self.sql.retry_step
        else:
            stmt, params = self.sql.resolve_step, {**params, "state": state, "result": result}

        async def run(conn: AsyncConnection) -> bool:
            return bool((await conn.execute(stmt, params)).rowcount)

        return await self._executor.run("resolving the step", run, body_ran=None)

    async def stalled(self, *, limit: int = 100) -> list[tuple[str, str, str, str, str]]:
        async def run(conn: AsyncConnection) -> list[tuple[str, str, str, str, str]]:
            return [(r[0], r[1], r[2], r[3], r[4]) for r in await conn.execute(self.sql.stalled, {"limit": limit})]

        return await self._executor.run("listing stalled operations", run, body_ran=None)

    async def hold(self, scope: str, key: str, fence: int) -> bool:
        params = {"scope": scope, "key": key, "fence": fence}
        return await self._one("marking the operation held", self.sql.hold, params, body_ran=None) is not None

    async def settle(self, scope: str, key: str, result: str | None, retention: float) -> bool:
        params = {"scope": scope, "key": key, "retention": retention}
        if result is None:
            return await self._one("releasing the held operation", self.sql.release_held, params,
                                   body_ran=None) is not None
        params["result"] = result
        return await self._one("settling the held operation", self.sql.settle, params, body_ran=None) is not None

    async def abandon(self, scope: str, key: str, result: str, retention: float) -> bool:
        params = {"scope": scope, "key": key, "result": result, "retention": retention}
        return await self._one("abandoning the operation", self.sql.abandon, params, body_ran=None) is not None

    async def sweep(self, batch: int = 1000) -> int:
        """Delete records past their retention, in short batches of at most ``batch``, paced (``_sweep``);
        never a running claim whose lease is live."""

        async def run(size: int) -> int:
            async def one(conn: AsyncConnection) -> int:
                return int((await conn.execute(self.sql.sweep, {"batch": size})).rowcount or 0)

            return await self._executor.run("sweeping expired records", one, body_ran=None)

        total = await paced(run, batch)
        if total:
            # Steps of deleted records are unreachable anyway (a new record has a new origin): tidy them. Only
            # after a sweep that deleted something: the pass reads every step, and a sweep with nothing to
            # delete reads nothing (steps a restart left behind wait for the next sweep that deletes).
            async def orphans(conn: AsyncConnection) -> None:
                await conn.execute(self.sql.sweep_steps)

            await self._executor.run("sweeping orphaned steps", orphans, body_ran=None)
        return total

    async def listing(
        self, *, scope: str | None = None, task_id: str | None = None, limit: int = 100, state: str | None = None
    ) -> Sequence[Listing]:
        params = {"scope": scope, "task_id": task_id, "limit": limit, "state": state}

        async def run(conn: AsyncConnection) -> list[Listing]:
            rows = await conn.execute(self.sql.listing, params)
            return [listing_from_row(r) for r in rows]

        return await self._executor.run("listing records", run, body_ran=None)

    # -- the ledger of attempts, and an operator's look at one record (``LedgerStore``): the ledger's verbs ----

    async def write_attempts(self, rows: Sequence[Sequence[Any]]) -> int:
        return await self.ledger.write_attempts(rows)

    async def read_attempts(
        self, *, key: str | None = None, task_id: str | None = None, scope: str | None = None,
        since: float | None = None, limit: int = 1000,
    ) -> list[Attempt]:
        return await self.ledger.read_attempts(key=key, task_id=task_id, scope=scope, since=since, limit=limit)

    async def sweep_attempts(self, batch: int = 1000) -> int:
        return await self.ledger.sweep_attempts(batch)

    async def verify_ledger(self, scope: str | None = None) -> list[ChainCheck]:
        return await self.ledger.verify_ledger(scope)

    async def record_details(self, key: str, scope: str | None = None) -> list[RecordDetail]:
        return await self.ledger.record_details(key, scope)

    async def forget(self, scope: str, key: str) -> bool:
        return await self.ledger.forget(scope, key)

    async def task_known(self, task_id: str) -> bool:
        return await self.ledger.task_known(task_id)


class _StepTransaction:
    """``op.transaction``'s transaction: the caller's statements on ``connection``, and the step's record."""

    __slots__ = ("_step", "_store", "connection")

    def __init__(self, store: SQLStore, conn: AsyncConnection, step: dict[str, Any]) -> None:
        self._store, self.connection, self._step = store, conn, step

    async def record(self, result: str) -> None:
        params = {**self._step, "state": DONE, "result": result}
        await self._store._executor.execute(STEP, self.connection, self._store.sql.put_step, params, body_ran=True)


if TYPE_CHECKING:  # mypy proves that SQLStore implements every interface
    _implements: Store = SQLStore("sqlite+aiosqlite://")
    _ledger: LedgerStore = SQLStore("sqlite+aiosqlite://")
