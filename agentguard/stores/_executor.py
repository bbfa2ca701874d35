"""Running the store's statements: the schema made before the first, two ways to run one, one retry policy,
and every failure turned into a ``StoreError`` that says what failed.

- :meth:`Executor.one` — the hot path: one statement handed straight to the driver on an idle connection
  (the same way as :meth:`Executor.on_driver`, which runs the dialect's bulk writes). Where every connection
  of the loop is in use, a statement that has a form for many callers (``many``) waits with the others that
  came meanwhile, and they go as one statement (:meth:`Executor._gathered`). :meth:`Executor.claim` runs the
  rest of a claim plan (``_claims``) there: statement by statement, or in one driver call where the dialect
  runs a plan so (SQLite: one hop to aiosqlite's thread).
- :meth:`Executor.run` — the general path: a function of a SQLAlchemy connection (optionally in a
  transaction), for everything off the hot path.
- :meth:`Executor.transaction` — a transaction the caller runs its own statements in (not retried).

One retry policy, on both paths (:meth:`Executor._retry`): a statement whose connection was found dead (killed
since it was pooled: a server restart, ``pg_terminate_backend``) is repeated once on a fresh connection. Every
statement of the store is safe to repeat once: claims carry an owner token, writes are fenced. A statement
refused by a serialization failure or a deadlock (Postgres, where the database's default isolation is stricter
than read committed: callers starting at once meet one another's predicate locks) did nothing; it is run again,
after a short random pause, up to ``CONFLICT_RETRIES`` times. A failure to connect is not retried here: it is an
outage, and the guard decides what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._errors import StoreError
from .._redact import redact_text
from ._claims import CLAIMING, Claimed, Plan, arun
from ._dialects import Dialect, wrapped
from ._engines import Engines
from ._lane import Lane
from ._statements import GATHER_MAX, Compiled, Many

log = logging.getLogger("agentguard.store")
CONFLICT_RETRIES = 3  # times a statement refused by a serialization failure or a deadlock is run again
CONFLICT_PAUSE = 0.01  # seconds, times the attempt: the longest random pause before it runs again
T = TypeVar("T")


class Batch:
    """Callers of one statement gathered while every connection of their lane is in use (``Executor._gathered``):
    their parameters and answers, and the task that sends them as one statement."""

    __slots__ = ("arrivals", "calls", "lined", "sealed", "sent", "went")

    def __init__(self, lane: Lane) -> None:
        # Its place in the lane's line, taken when it is formed (its callers wait there, not behind whoever
        # lines up before its task runs); None once its task waits in it.
        self.lined: asyncio.Future[Any] | None = lane.line_up()
        self.arrivals = lane.arrivals
        self.calls: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []
        self.sealed = False  # nobody joins it any more (callers who come now gather into the next one)
        self.went = False  # its statement has its connection, with the parameters of the callers in it then
        self.sent: asyncio.Task[None] | None = None

    def joins(self, lane: Lane, many: Many, params: dict[str, Any]) -> bool:
        """Whether a caller with ``params`` coming now may join it: it is not on its way, not full, nobody has
        lined up in the lane behind it (joining would pass them: first come, first served), and the statement may
        take the caller with those in it (``Many.joins``)."""
        return (not self.sealed and len(self.calls) < GATHER_MAX and lane.arrivals == self.arrivals
                and many.joins((p for p, _ in self.calls), params))  # (read only by a statement that asks)

    def ended(self, lane: Lane, _sent: asyncio.Task[None]) -> None:
        """Its task ended: if it never ran (cancelled first, as a closing loop cancels it), its place in the line
        is left, or what the place was handed passed on."""
        if self.lined is not None:
            lane.leave(self.lined)
            self.lined = None


class Executor:
    """Runs statements for one store. ``make_schema`` creates the schema on a connection (autocommit)."""

    def __init__(self, dialect: Dialect, make_schema: Callable[[AsyncConnection], Awaitable[None]]) -> None:
        self.dialect = dialect
        self.engines = Engines(dialect)
        self._make_schema_on = make_schema
        self._fetch = dialect.fetch_row
        self.schema_ready = False
        self._schema_tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    def after_fork(self, refusal: str | None = None) -> None:
        """In a forked child: the parent's engines are abandoned, this process makes its own (``_fork``);
        ``refusal``: why it may not use the store at all (``Engines.after_fork``)."""
        self._schema_tasks = weakref.WeakKeyDictionary()
        self.engines.after_fork(refusal)

    # -- the schema, before the first statement -------------------------------------------------------

    async def ensure_schema(self) -> None:
        """Create the tables if missing; safe when many processes start at once.

        Runs once per loop in its own task, which callers await shielded: a caller cancelled meanwhile (a
        client timeout on the very first call) never cuts a connect or a DDL transaction in half."""
        if self.schema_ready:
            return
        loop = asyncio.get_running_loop()
        making = self._schema_tasks.get(loop)
        if making is None:
            making = self._schema_tasks[loop] = loop.create_task(self._make_schema())
            making.add_done_callback(functools.partial(self._schema_done, loop))
        await asyncio.shield(making)

    def _schema_done(self, loop: asyncio.AbstractEventLoop, making: asyncio.Task[None]) -> None:
        # Forget it (the task holds the loop: a weak key must not stay reachable from its value); a failure
        # is seen by its awaiters, and the next caller tries again.
        if self._schema_tasks.get(loop) is making:
            del self._schema_tasks[loop]
        if not making.cancelled():
            making.exception()

    async def _make_schema(self) -> None:
        if self.schema_ready:
            return
        self.dialect.prepare()
        try:
            await self.dialect.probe()  # (before the pool's first connection, whose settings it decides)
        except StoreError:
            raise
        except Exception as exc:
            raise self.error("checking the server", exc, False) from exc
        try:
            async with self.engines.connection() as conn:
                await self._make_schema_on(conn)
        except StoreError:
            raise
        except Exception as exc:  # (the driver's own, unwrapped by SQLAlchemy: a bad connect argument)
            raise self.error("creating the schema", exc, False) from exc
        self.schema_ready = True

    # -- the hot path -----------------------------------------------------------------------------------

    def _compiled(self, stmt: Any, engine: AsyncEngine | None = None) -> Compiled:
        """The driver-level SQL of one of the store's statements and a getter of its positional arguments from
        the named parameters, built once (``Dialect.compiled``)."""
        return self.dialect.compiled(stmt)

    async def one(
        self, what: str, stmt: Any, params: dict[str, Any], *, body_ran: bool | None = False, writes: bool = True,
        many: Many | None = None,
    ) -> Any:
        """One statement, one round trip (one thread hop on SQLite): its first row, or None.

        A shortcut beside :meth:`run`: SQLAlchemy still owns the pool and the dialect, but the statement (compiled
        once: ``Dialect.compiled``) goes straight to the driver (asyncpg's prepared-statement cache, a function on
        aiosqlite's thread) on a connection of the loop's lane (``_lane.Lane``), skipping the per-statement cursor,
        result and reset steps of the general path — on aiosqlite each of them a thread hop. It must answer
        what ``run(what, lambda conn: conn.execute(stmt, params).first())`` answers (tests/whitebox/test_executors.py).

        ``many``: the statement's form for many callers (where the dialect ``gathers``), used when every
        connection of the lane is in use (:meth:`_gathered`). ``writes``: it writes (SQLite: it takes the write
        lock, waited for in short sleeps). ``body_ran``: whether the tool body had run, for the ``StoreError``
        if it fails.
        """
        if not self.schema_ready:
            await self.ensure_schema()
        engine, lane = self.engines.here()
        if many is not None and lane.gathers():
            return await self._gathered(engine, lane, what, stmt, many, params, body_ran)
        sql, getter = self.dialect.compiled(stmt)
        args = getter(params)
        return await self._on_lane(engine, lane, what, lambda drv: self._fetch(drv, sql, args, writes), body_ran)

    async def claim(self, plan: Plan) -> Claimed:
        """The rest of a claim plan (``_claims``): statement by statement through :meth:`one` (each a round trip,
        the claim's insert gathered under load), or, where the dialect runs a plan in one driver call (SQLite),
        in one hop, retried as one statement is."""
        if not self.dialect.plans_in_one_hop:
            params = plan.params
            return await arun(plan, lambda ask: self.one(ask.what, ask.stmt, params, body_ran=ask.body_ran,
                                                          writes=ask.writes, many=ask.many))
        if not self.schema_ready:
            await self.ensure_schema()
        engine, lane = self.engines.here()
        fetch_plan = self.dialect.fetch_plan
        await self._on_lane(engine, lane, CLAIMING, lambda drv: fetch_plan(drv, plan), False)
        return plan.answer

    async def _gathered(self, engine: AsyncEngine, lane: Lane, what: str, stmt: Any, many: Many,
                        params: dict[str, Any], body_ran: bool | None) -> Any:
        """``stmt`` with ``params`` while every connection of ``lane`` is in use: the caller joins the callers of
        the same statement that came since a connection was last free, and they go as one statement (``many``)
        on the next connection the line hands on, in the place of the first of them. What each caller gets is
        what ``stmt`` alone would have answered it. A shortcut beside one statement each, which it must equal
        (tests/whitebox/test_gather.py): one round trip and one commit for them all, where the callers would have waited
        anyway.

        The statement is sent by a task of the lane's, not by any caller, so a caller cancelled meanwhile leaves
        the others' statement whole. Such a caller leaves the batch if it has not gone yet; if it has, the
        caller waits for it to end before the cancellation goes on, so that whatever the caller does about a
        cancelled statement (a claim is released by its owner token) comes after it.

        First come, first served, as in the lane's line: a caller joins only a statement that nobody else has
        lined up behind (``Batch.joins``), else it forms the next one, in its own place in the line."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        batch: Batch | None = lane.gathering.get(many)
        if batch is None or not batch.joins(lane, many, params):
            if batch is not None:
                batch.sealed = True  # (it goes as it is)
            batch = lane.gathering[many] = Batch(lane)
            batch.sent = loop.create_task(self._send_gathered(engine, lane, what, stmt, many, batch, body_ran))
            batch.sent.add_done_callback(functools.partial(batch.ended, lane))
            lane.keep(batch.sent)
        batch.calls.append((params, answer))
        try:
            return await answer
        except asyncio.CancelledError:
            if not batch.went:  # it goes without this caller
                batch.calls.remove((params, answer))
            elif batch.sent is not None:
                await asyncio.wait((batch.sent,))
            raise

    async def _send_gathered(self, engine: AsyncEngine, lane: Lane, what: str, stmt: Any, many: Many, batch: Batch,
                             body_ran: bool | None) -> None:
        sql, getter = self.dialect.compiled(stmt)

        def taken() -> list[dict[str, Any]]:
            if not batch.went:
                batch.went = True
                if lane.gathering.get(many) is batch:
                    del lane.gathering[many]
                batch.sealed = True
            return [params for params, _ in batch.calls]

        def alone(params: dict[str, Any]) -> Callable[[Any], Awaitable[Any]]:
            return lambda drv: self._fetch(drv, sql, getter(params))

        async def send(drv: Any) -> list[Any]:
            params = taken()
            if len(params) == 1:  # the statement itself
                return [await self._fetch(drv, sql, getter(params[0]))]
            if not params:  # (every caller was cancelled)
                return []
            return await self.send_many(drv, many, params)

        lined, batch.lined = batch.lined, None
        try:
            try:
                answers: list[Any] = await self._on_lane(engine, lane, what, send, body_ran, lined, lane.patience)
            except Exception as exc:
                params = taken()
                if len(params) == 1:
                    answers = [exc]
                else:  # the database refused the statement (not all of them, perhaps): each caller's on its own
                    answers = await asyncio.gather(*(self._on_lane(engine, lane, what, alone(p), body_ran)
                                                     for p in params), return_exceptions=True)
            for (_, future), got in zip(batch.calls, answers, strict=True):
                if not future.done():  # (a caller cancelled meanwhile: its answer is nobody's)
                    if isinstance(got, BaseException):
                        future.set_exception(got)
                    else:
                        future.set_result(got)
        finally:  # (this task cancelled: a closing loop) its callers are cancelled too, never left waiting
            for _, future in batch.calls:
                future.cancel()

    async def send_many(self, drv: Any, many: Many, params: list[dict[str, Any]]) -> list[Any]:
        """``many`` for the callers with ``params`` on the driver connection ``drv`` (one round trip, one
        transaction): each caller's answer (``Many.answers``)."""
        fetch = self.dialect.fetch_each if many.pipelined else self.dialect.fetch_rows
        return many.answers(await fetch(drv, many.sql, many.args(params)), params)

    async def on_driver(self, what: str, call: Callable[[Any], Awaitable[T]], *, body_ran: bool | None) -> T:
        """``call(drv)``, one driver call, on the driver connection of a connection of the loop's lane
        (``_lane.Lane``), as :meth:`one`'s statements run: the ledger's chained batches (``_chain``)."""
        if not self.schema_ready:
            await self.ensure_schema()
        engine, lane = self.engines.here()
        return await self._on_lane(engine, lane, what, call, body_ran)

    async def _on_lane(self, engine: AsyncEngine, lane: Lane, what: str, call: Callable[[Any], Awaitable[T]],
                       body_ran: bool | None, lined: asyncio.Future[Any] | None = None,
                       patience: float | None = None) -> T:
        """``call(drv)`` on a connection of ``lane``, run again as :meth:`_retry` says (once on a fresh connection if
        its connection was lost). ``lined``: the place in the lane's line its first attempt takes (``Lane.line_up``),
        and how long it waits there while the lane may open another (``patience``)."""
        for attempt in itertools.count(1):  # (until _retry says no: it always does, in time)
            try:
                conn = await lane.acquire(engine, lined if attempt == 1 else None, patience)
            except Exception as exc:  # the pool raises the driver's own errors here, unwrapped
                raise self.error(what, exc, body_ran) from exc
            raw, drv = conn
            sound = False
            try:
                answer = await call(drv)
                sound = True
                return answer
            except Exception as exc:
                if not await self._retry(what, exc, attempt, raw, drv):
                    raise self.error(what, exc, body_ran) from exc
            finally:
                # Cancelled mid-statement (not sound): both drivers recover the connection by themselves
                # (asyncpg completes its cancel request before the next query; aiosqlite finishes the
                # statement on its thread), so it goes back to the pool as it is; terminating it here would
                # race asyncpg's cancel protocol.
                await lane.release(conn, sound=sound)
        raise AssertionError("unreachable")

    # -- the general path --------------------------------------------------------------------------------

    async def run(
        self, what: str, fn: Callable[[AsyncConnection], Awaitable[T]], *, body_ran: bool | None,
        transaction: bool = False,
    ) -> T:
        """``fn(conn)`` on a connection checked out for it (in a transaction at the dialect's step isolation
        if ``transaction``), run again as :meth:`_retry` says (once on a fresh connection if its connection was
        lost)."""
        if not self.schema_ready:
            await self.ensure_schema()
        for attempt in itertools.count(1):  # (until _retry says no: it always does, in time)
            opened = False
            try:
                async with self.engines.connection() as conn:
                    opened = True
                    if not transaction:
                        return await fn(conn)
                    tx_conn = await conn.execution_options(isolation_level=self.dialect.step_isolation)
                    async with tx_conn.begin():
                        return await fn(tx_conn)
            except (SQLAlchemyError, OSError) as exc:
                if not (opened and await self._retry(what, exc, attempt)):
                    raise self.error(what, exc, body_ran) from exc
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def transaction(self, what: str, *, body_ran: bool | None) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction at the dialect's step isolation, for the caller's own statements;
        committed when the block ends, rolled back if it raises. The caller's own errors pass through as they
        are; the store's (connecting, committing) become a ``StoreError``. Not retried: the caller's work in
        it would run twice."""
        if not self.schema_ready:
            await self.ensure_schema()
        raised_inside: BaseException | None = None
        try:
            async with self.engines.connection() as conn:
                tx_conn = await conn.execution_options(isolation_level=self.dialect.step_isolation)
                async with tx_conn.begin():
                    try:
                        yield tx_conn
                    except BaseException as exc:  # the caller's own error (e.g. its IntegrityError): not ours
                        raised_inside = exc
                        raise
        except (SQLAlchemyError, OSError) as exc:
            if exc is raised_inside:
                raise
            raise self.error(what, exc, body_ran) from exc

    async def execute(self, what: str, conn: AsyncConnection, stmt: Any, params: dict[str, Any], *,
                      body_ran: bool | None) -> Any:
        """The store's own statement inside a :meth:`transaction`: its result, or a ``StoreError``."""
        try:
            return await conn.execute(stmt, params)
        except (SQLAlchemyError, OSError) as exc:
            raise self.error(what, exc, body_ran) from exc

    # -- failures ------------------------------------------------------------------------------------------

    async def _retry(self, what: str, exc: BaseException, attempt: int, raw: Any = None, drv: Any = None) -> bool:
        """The one retry policy: whether to run the statement again, after ``exc`` on ``attempt`` (from 1). A
        serialization failure or a deadlock: up to ``CONFLICT_RETRIES`` times, each after a random pause. A lost
        connection: once. It is invalidated (``raw``, if the caller holds it; SQLAlchemy already did on the
        general path), and so are the idle ones: they are likely dead too."""
        if self.dialect.conflicted(exc):
            if attempt > CONFLICT_RETRIES:
                return False
            log.info("%s met a serialization failure or a deadlock; running it again", what)
            await asyncio.sleep(random.random() * CONFLICT_PAUSE * attempt)
            return True
        if not self.dialect.connection_lost(exc, drv):
            return False
        if raw is not None:
            raw.invalidate()
        await self.engines.drop_idle()
        if attempt > 1:
            return False
        log.warning("store connection lost during %s; retrying once on a new connection", what)
        return True

    def error(self, what: str, exc: BaseException, body_ran: bool | None) -> StoreError:
        """What failed, as a ``StoreError``: ``the store failed (WHAT: DETAIL)``, the detail without secrets.
        ``body_ran``: whether the tool body had run (None: not a call's step, e.g. an operator's listing)."""
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, PoolTimeout):  # (SQLAlchemy's words name its pool's sizes, none of the store's settings)
            d = self.dialect
            detail = (f"all {d.capacity} connections this event loop's pool may hold were in use for "
                      f"{d.options.connect_timeout:g}s; " + (
                          "raise max_connections (the worker's budget; and the pooler's pool or the server's "
                          "max_connections with it), or run fewer calls at once" if hasattr(d, "budget") else
                          "raise pool_size, or run fewer calls at once"))
        hint = _hint(exc)
        if hint:  # the driver's advice (asyncpg's names PgBouncer's transaction pooling): kept, on one line
            detail = f"{detail}; hint: {hint}"
        return StoreError(f"the store failed ({what}: {redact_text(detail)})", body_ran=bool(body_ran),
                          transient=self.dialect.transient(exc))


def _hint(exc: BaseException) -> str:
    """The ``HINT`` the server or driver gave with ``exc`` (or with an error it wraps), on one line; else ''."""
    for e in wrapped(exc):
        hint = getattr(e, "hint", None)
        if isinstance(hint, str) and hint.strip():
            return " ".join(hint.split())
    return ""
