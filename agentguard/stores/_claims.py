"""A claim, written once: two plans of statements, sans I/O, that every executor runs.

Whatever the plan, a claim is decided by ``INSERT ... ON CONFLICT (scope, key) DO NOTHING`` — the row count is
the answer, never a check-then-insert: a read only ever answers with a record that is there, and whatever it
finds absent, the insert decides — and answers the same: our fence if we claimed the key, else the record
that holds it, or None if that record vanished before it could be read (swept between the insert and the
read, or kept vanishing and reappearing): the caller claims again, a bounded number of times.

- :func:`insert_first`, for a key likely free (a first call, on Postgres): the insert; on a conflict, a read.
  One statement for a first call, two where the key is taken.
- :func:`read_first`, for a key likely taken (a replaying task's call, a caller looking again), and on SQLite
  for every claim (a read there costs no round trip, and never waits for the writer): the read; the insert only
  if nothing was read; and a conflict there (another caller inserted meanwhile) reads again, at most
  ``TURNS`` times. One statement for a replay, and no write lock taken for it.

A plan is a generator: it yields each statement it asks (an :class:`Ask`), is sent that statement's first row
(or None), and returns the answer. It does no I/O and knows no thread, loop or driver. An executor runs it
(:class:`Progress`, :func:`run` in a thread, :func:`arun` on an event loop; statement by statement, or the rest
of it in one hop to a driver's thread, ``_aiosqlite.fetch_plan``); an executor that cannot serve a statement
hands the plan, as far as it got, to another. Whoever runs it, the statements and the decision are these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple

from ._schema import Record, record_from_row
from ._statements import Many

CLAIMING = "claiming the key"
READING = "reading the record"
TURNS = 3  # read-first: reads and inserts before the plan answers None (the record keeps vanishing)

Claimed = int | Record | None


class Ask(NamedTuple):
    """One statement, as a plan or a verb asks it: what it does (for a ``StoreError``: "claiming the key"), the
    statement, and what an executor needs to know of it — whether the tool body had run (for the
    ``StoreError``), whether it writes (SQLite: it takes the write lock), whether it is a claim's insert (its
    commit may go unsynced where the store's claims do: SQLite at ``FULL``), and its form for many callers
    (gathered where the executor gathers: Postgres' lane)."""

    what: str
    stmt: Any
    body_ran: bool | None = False
    writes: bool = True
    claims: bool = False
    many: Many | None = None


Plan = Generator[Ask, Any, Claimed]
PlanMaker = Callable[[Ask, Ask, dict[str, Any]], Plan]  # (the read, the claim, the claim's parameters)


def insert_first(read: Ask, claim: Ask, params: dict[str, Any]) -> Plan:
    """For a key likely free: the insert decides; on a conflict, a read returns the record there."""
    row = yield claim
    if row is not None:
        return int(row[0])
    row = yield read
    return None if row is None else record_from_row(params["scope"], params["key"], row)


def read_first(read: Ask, claim: Ask, params: dict[str, Any]) -> Plan:
    """For a key likely taken: the record there, read; else the insert decides. A racing insert that wins
    between the read and ours makes ours do nothing: read again."""
    for _ in range(TURNS):
        row = yield read
        if row is not None:
            return record_from_row(params["scope"], params["key"], row)
        row = yield claim
        if row is not None:
            return int(row[0])
    return None  # the record keeps vanishing and reappearing: the caller's bounded retry decides


class Progress:
    """A plan as far as it has run: the statement it waits for (``ask``; None once it ended) and then its answer.
    Run by one executor, or handed on, at the statement it waits for, to another."""

    __slots__ = ("_plan", "answer", "ask")

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self.answer: Claimed = None
        self.ask: Ask | None = next(plan)  # (every plan asks at least one statement)

    def answered(self, row: Any) -> None:
        """``ask``'s first row (or None): the plan goes on to its next statement, or ends with its answer."""
        try:
            self.ask = self._plan.send(row)
        except StopIteration as end:
            self.ask, self.answer = None, end.value


def run(progress: Progress, fetch: Callable[[Ask], Any]) -> Claimed:
    """The rest of a plan in this thread: ``fetch`` runs each statement (its first row, or None)."""
    while (ask := progress.ask) is not None:
        progress.answered(fetch(ask))
    return progress.answer


async def arun(progress: Progress, fetch: Callable[[Ask], Awaitable[Any]]) -> Claimed:
    """The rest of a plan on an event loop, statement by statement."""
    while (ask := progress.ask) is not None:
        progress.answered(await fetch(ask))
    return progress.answer
