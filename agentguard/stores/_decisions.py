"""A person's decision on a record (``agentguard resolve``, the console's settle forms), bound to the revision
of the record that the person saw.

A record's *revision* names what a person saw of it::

    7.1717171717123456.running.step.5c0a1f2e
    │ │                │       │    └ the step a decision settles (a digest of its name), or -
    │ │                │       └ how it is held (step, body, not_stored), or -
    │ │                └ its state
    │ └ its last change by the database clock, in microseconds: a completion, a release, a settle, a worker's
    │   renewal or step (a person's settle of a step changes it too: ``touch``)
    └ its fence: a claim or a takeover changes it

(a caller's hold mark changes only how the record is held). ``agentguard ls --unknown`` prints it, the console
shows it and sends it back with a decision. :func:`decide` makes the decision in one transaction that first
locks the record — a write to its row, which every worker's write to the record, its steps' included (each
begins with a write to the row), waits for — then reads the revision, compares it with the one seen, and
writes only if they are the same. What a refusal says, and whether what changed is exactly what the same
decision makes (``already applied``), is worked out from the two by :func:`changed` and :func:`applied`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from ._schema import (
    DONE,
    FAILED,
    HELD_BODY,
    HELD_KINDS,
    HELD_NOT_STORED,
    HELD_STEP,
    RELEASED,
    RUNNING,
    STARTED,
    SUCCEEDED,
)

if TYPE_CHECKING:
    from ._executor import Executor
    from ._statements import Statements

How = Literal["result", "retry", "abandon"]
STATES = (RUNNING, SUCCEEDED, FAILED, RELEASED)
NONE = "-"


def step_digest(name: str) -> str:
    """A step's name in a revision: short, fixed-length, whatever the name holds (dots, spaces, 255 characters)."""
    return hashlib.sha256(name.encode()).hexdigest()[:8]


def revision(fence: int, updated: float, state: str, held: str | None, step: str | None) -> str:
    """The revision of a record: its fence, its last change (microseconds), its state, how it is held and the
    step a decision would settle (the first one started, for a record held on a step)."""
    return (f"{fence}.{round(updated * 1_000_000)}.{state}.{held or NONE}."
            f"{step_digest(step) if step is not None and held == HELD_STEP else NONE}")


@dataclass(frozen=True, slots=True)
class Seen:
    """A revision a person sent back, read into its parts."""

    text: str
    fence: int
    updated: float  # seconds since the epoch, by the database clock
    state: str
    held: str  # "" if it was not held
    step: str  # the digest of the step it was held on, or ""


def parse_revision(text: str) -> Seen:
    """The parts of ``text``; ValueError if it is not a revision agentguard writes."""
    parts = text.strip().split(".")
    ok = (len(parts) == 5 and parts[0].isdigit() and parts[1].isdigit() and parts[2] in STATES
          and parts[3] in (*HELD_KINDS, NONE) and (parts[4] == NONE or (len(parts[4]) == 8 and _hex(parts[4]))))
    if not ok:
        raise ValueError(f"{text[:80]!r} is not a record's revision (as `agentguard ls --unknown` prints it, e.g. "
                         "7.1717171717123456.running.step.5c0a1f2e)")
    fence, micros, state, held, step = parts
    return Seen(text.strip(), int(fence), int(micros) / 1_000_000, state, "" if held == NONE else held,
                "" if step == NONE else step)


def _hex(s: str) -> bool:
    return all(ch in "0123456789abcdef" for ch in s)


@dataclass(frozen=True, slots=True)
class Version:
    """A record as a decision reads it (in its transaction, the record locked)."""

    state: str
    fence: int
    updated: float
    held: str  # "" if not held, else one of ``HELD_KINDS``
    live: bool
    attempts: int
    result: str | None
    steps: tuple[tuple[str, str, str | None], ...]  # (name, state, result) of its current origin, in order

    @property
    def step(self) -> str | None:
        """The step a decision settles: the first one started (for a record held on a step)."""
        if self.held != HELD_STEP:
            return None
        return next((name for name, state, _ in self.steps if state == STARTED), None)

    @property
    def revision(self) -> str:
        return revision(self.fence, self.updated, self.state, self.held, self.step)

    def step_named(self, digest: str) -> tuple[str, str, str | None] | None:
        return next((s for s in self.steps if step_digest(s[0]) == digest), None)


@dataclass(frozen=True, slots=True)
class Decided:
    """What :func:`decide` found and did: ``before``, the record it found (None: no record); ``after``, the
    record once the decision was written (None: nothing was written); ``step``, the step it settled."""

    before: Version | None
    after: Version | None = None
    step: str | None = None

    @property
    def applied(self) -> bool:
        return self.after is not None


async def _version(sql: Statements, conn: AsyncConnection, params: dict[str, str]) -> Version | None:
    row = (await conn.execute(sql.version, params)).first()
    if row is None:
        return None
    steps = await conn.execute(sql.load_steps, {**params, "origin": row[7]})
    return Version(row[0], int(row[1]), float(row[2]), row[3] or "", bool(row[4]), int(row[5]), row[6],
                   tuple((s[0], s[2], s[3]) for s in steps))


async def decide(executor: Executor, sql: Statements, scope: str, key: str, how: How, value: str | None,
                 retention: float, *, seen: str | None = None) -> Decided:
    """Settle the record ``key`` of ``scope`` as ``how`` says (``value``: the encoded result, or for ``abandon``
    the encoded error), if it can be so settled and — when ``seen`` is given — its revision is still ``seen``.
    Nothing is written otherwise; the caller tells why from what was found."""
    params = {"scope": scope, "key": key}

    async def run(conn: AsyncConnection) -> Decided:
        if not (await conn.execute(sql.lock_record, params)).rowcount:
            return Decided(None)
        before = await _version(sql, conn, params)
        if before is None or (seen is not None and before.revision != seen):
            return Decided(before)
        dead = not before.live and before.state in (RUNNING, RELEASED)
        step = None
        at: dict[str, Any]
        if how == "abandon":
            if not (dead or before.held == HELD_NOT_STORED):
                return Decided(before)
            stmt, at = sql.abandon, {"result": value, "retention": retention}
        elif before.held in (HELD_BODY, HELD_NOT_STORED):
            stmt, at = (sql.settle if how == "result" else sql.release_held), {"result": value, "retention": retention}
        elif before.held == HELD_STEP and (step := before.step) is not None:
            stmt, at = ((sql.resolve_step, {"name": step, "state": DONE, "result": value}) if how == "result"
                        else (sql.retry_step, {"name": step}))
        else:
            return Decided(before)
        got = await conn.execute(stmt, {**params, **at})
        # (a record's statement returns its row; a step's returns none, and tells by its row count)
        if not (got.rowcount if step is not None else got.first() is not None):
            return Decided(before)  # (not reached: the record is locked, and its statement checks what was read)
        if step is not None:
            await conn.execute(sql.touch, params)  # a step settled is a change of its record: a new revision
        return Decided(before, await _version(sql, conn, params), step)

    return await executor.run("settling the held operation", run, body_ran=None, transaction=True)


def applied(seen: Seen, now: Version | None, how: How, value: str | None) -> str | None:
    """If the record went from ``seen`` to ``now`` by exactly what ``how`` (with ``value``) makes of it — the
    same decision, sent again or by someone else — what it did (as :func:`said`); else None. No claim since
    (the same fence), and nobody running it."""
    if now is None or now.fence != seen.fence or now.live:
        return None
    if how == "abandon":
        return said(how, None) if now.state == FAILED and now.result == value else None
    if seen.held in (HELD_BODY, HELD_NOT_STORED):
        if how == "result" and now.state == SUCCEEDED and now.result == value:
            return said(how, None)
        if how == "retry" and now.state == RELEASED and now.result is None:
            return said(how, None)
        return None
    if seen.held != HELD_STEP or now.state not in (RUNNING, RELEASED):
        return None
    step = now.step_named(seen.step)
    if how == "result" and step is not None and step[1] == DONE and step[2] == value:
        return said(how, step[0])
    if how == "retry" and step is None:  # its row is gone: a retry deletes it
        return "the step was cleared for a retry"
    return None


def said(how: How, step: str | None) -> str:
    """What a decision did, in the words ``agentguard resolve`` prints."""
    if how == "abandon":
        return "abandoned"
    if step is not None:
        return f"step {step!r} " + ("recorded as done" if how == "result" else "cleared for a retry")
    return "its result recorded" if how == "result" else "cleared for a retry: its next call runs it again"


def changed(seen: Seen, now: Version | None, abandoned: str | None, by_operator: bool) -> str:
    """What became of the record since ``seen``, in a few words (``abandoned``: the stored error an abandon
    writes; ``by_operator``: the ledger holds an operator's act on it since then)."""
    if now is None:
        return "it is gone (forgotten, or swept after its retention)"
    if now.fence != seen.fence:
        return f"it was claimed again meanwhile (attempt {now.attempts}): it is {_now(now)}"
    if now.live:
        return "its worker came back and renewed its lease: it is running"
    who = "another operator" if by_operator else None
    if now.state == FAILED and now.result == abandoned:  # (one that failed to store its result was failed too)
        return f"{who} abandoned it" if who else "it was abandoned meanwhile"
    if now.state != seen.state:
        if now.state == RELEASED:
            return f"{who} cleared it for a retry: it was released meanwhile" if who else "it was released meanwhile"
        if now.state == SUCCEEDED:
            return f"{who} recorded a result" if who else "it succeeded meanwhile"
        if now.state == FAILED:
            return "it failed meanwhile"
    if seen.held == HELD_STEP:
        step = now.step_named(seen.step)
        if step is None:
            return (f"{who} cleared its step for a retry" if who else
                    "the step it was held on was cleared for a retry meanwhile")
        if step[1] == DONE:
            return (f"{who} recorded the step's result" if who else
                    f"the step {step[0]!r} was recorded as done meanwhile")
    if now.held != seen.held:
        if now.held == HELD_BODY:
            return "it was marked held meanwhile: a caller found its worker gone inside the body"
        if now.held == HELD_STEP:
            return f"it is now held on its step {now.step!r}"
        return f"it is now {_now(now)}"
    return f"it changed meanwhile: it is {_now(now)}"


def _now(v: Version) -> str:
    if v.live:
        return "running"
    if v.held:
        return {HELD_STEP: f"held on its step {v.step!r}", HELD_BODY: "held on its body",
                HELD_NOT_STORED: "held: its result could not be stored"}[v.held]
    return "running, its lease expired" if v.state == RUNNING else v.state
