"""A claim, written once: two plans of statements, sans I/O, that every executor runs.

Whatever the plan, a claim is decided by ``INSERT ... ON CONFLICT (scope, key) DO NOTHING`` — the row count is
the answer, never a check-then-insert: a read only ever answers with a record that is there, and whatever it
finds absent, the insert decides — and answers the same: our fence if we claimed the key, else the record
that holds it, or None if that record vanished before it could be read (swept between the insert and the
read, or kept vanishing and reappearing): the caller claims again, a bounded number of times.

- :class:`InsertFirst`, for a key likely free (a first call, on Postgres): the insert; on a conflict, a read.
  One statement for a first call, two where the key is taken.
- :class:`ReadFirst`, for a key likely taken (a replaying task's call, a caller looking again), and on SQLite
  for every claim (a read there costs no round trip, and never waits for the writer): the read; the insert only
  if nothing was read; and a conflict there (another caller inserted meanwhile) reads again, at most
  ``TURNS`` times. One statement for a replay, and no write lock taken for it.

A plan is a small state machine (as h11's and wsproto's are): it says the statement it asks next (an
:class:`Ask`), takes that statement's first row (or None), and ends with the answer. It does no I/O and knows
no thread, loop or driver. An executor runs it (:func:`run` in a thread, :func:`arun` on an event loop;
statement by statement, or the rest of it in one hop to a driver's thread, ``_aiosqlite.fetch_plan``); an
executor that cannot serve a statement hands the plan, as far as it got, to another. Whoever runs it, the
statements and the decision are these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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


class Plan:
    """A claim plan as far as it has run: the statement it waits for (``ask``; None once it ended), and then its
    answer. An executor runs ``ask`` and hands its first row (or None) to :meth:`answered`; it may hand the plan on,
    at the statement it waits for, to another executor."""

    __slots__ = ("answer", "ask", "claim", "params", "read")

    def __init__(self, read: Ask, claim: Ask, params: dict[str, Any]) -> None:
        self.read, self.claim, self.params = read, claim, params
        self.answer: Claimed = None
        self.ask: Ask | None = None

    def answered(self, row: Any) -> None:
        """``ask``'s first row (or None): the plan goes on to its next statement, or ends with its answer."""
        raise NotImplementedError

    def _record(self, row: Any) -> Record | None:
        return None if row is None else record_from_row(self.params["scope"], self.params["key"], row)


class InsertFirst(Plan):
    """For a key likely free: the insert decides; on a conflict, a read returns the record there (None if it
    vanished in between)."""

    __slots__ = ()

    def __init__(self, read: Ask, claim: Ask, params: dict[str, Any]) -> None:
        self.read, self.claim, self.params, self.answer, self.ask = read, claim, params, None, claim

    def answered(self, row: Any) -> None:
        if self.ask is not self.claim:  # the read of the record that holds the key
            self.ask, self.answer = None, self._record(row)
        elif row is not None:  # the insert claimed the key: our fence
            self.ask, self.answer = None, int(row[0])
        else:  # the key is taken
            self.ask = self.read


class ReadFirst(Plan):
    """For a key likely taken: the record there, read; else the insert decides. A racing insert that wins between
    the read and ours makes ours do nothing: read again, at most ``TURNS`` times (then None: the record keeps
    vanishing and reappearing, and the caller's bounded retry decides)."""

    __slots__ = ("turns",)

    def __init__(self, read: Ask, claim: Ask, params: dict[str, Any]) -> None:
        self.read, self.claim, self.params, self.answer, self.ask, self.turns = read, claim, params, None, read, 1

    def answered(self, row: Any) -> None:
        if self.ask is self.read:
            if row is not None:  # a record there answers: never a write for a replay
                self.ask, self.answer = None, self._record(row)
            else:  # nothing there: the insert decides
                self.ask = self.claim
        elif row is not None:  # the insert claimed the key: our fence
            self.ask, self.answer = None, int(row[0])
        elif self.turns < TURNS:  # inserted meanwhile by another caller: read it
            self.ask, self.turns = self.read, self.turns + 1
        else:
            self.ask = None


PlanMaker = Callable[[Ask, Ask, dict[str, Any]], Plan]  # (the read, the claim, the claim's parameters)


def run(plan: Plan, fetch: Callable[[Ask], Any]) -> Claimed:
    """The rest of a plan in this thread: ``fetch`` runs each statement (its first row, or None)."""
    while (ask := plan.ask) is not None:
        plan.answered(fetch(ask))
    return plan.answer


async def arun(plan: Plan, fetch: Callable[[Ask], Awaitable[Any]]) -> Claimed:
    """The rest of a plan on an event loop, statement by statement."""
    while (ask := plan.ask) is not None:
        plan.answered(await fetch(ask))
    return plan.answer
