"""The drivers of the state machine (``agentguard._machine``): they run its plans and move the body.

- The async driver answers each request on the caller's loop (the store's verb awaited there; an in-memory
  store's on the portal's loop, where its one connection lives) and awaits the body in the caller's task.
- The sync driver runs the body in the caller's thread and answers each request there where the store can
  (``SQLStore.direct``: a claim or a completion on a connection of that thread), and otherwise sends that one
  request, as it is, to the guard's portal loop: the same statement, the same parameters, the same owner token.
  A request the thread started and could not finish (a connection lost, the store away) goes to the portal too;
  every statement of the store is safe to repeat (a claim carries its owner token, every write is fenced).

A claim made in a sync tool's thread is renewed by the heartbeat on the portal's loop once its body outlives
a first tick (``_lease.PendingBeats``): a short body wakes no other thread.

Here too is the one place a call's ``Note`` is filled for the ledger and OpenTelemetry (``_observe``): with
nothing observing, no note is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import _machine
from ._calls import Call, Claim, Replay
from ._context import _key
from ._errors import GuardError, StoreError
from ._machine import (
    AwaitNews,
    ClaimKey,
    Complete,
    Hold,
    Machine,
    Pause,
    Plan,
    Release,
    ReleaseOwned,
    Request,
    ResumeBeat,
    Run,
    StartBeat,
    StopBeat,
    TakeOver,
)
from ._observe import Note
from ._watch import Watcher
from .stores._attempts import REPLAYED
from .stores._protocols import Direct

T = TypeVar("T")

# The claim of the guarded call in progress, for the ``Operation`` parameter and ``current_audit()``.
active_claim: contextvars.ContextVar[Claim | None] = contextvars.ContextVar("agentguard_claim", default=None)


async def uncancellable(aw: Awaitable[T]) -> T:
    """Finish ``aw`` even if we are cancelled meanwhile, then deliver the cancellation.

    Recording an outcome or releasing a claim must not be split by a client timeout.
    """
    inner = asyncio.ensure_future(aw)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(inner)
            break
        except asyncio.CancelledError:
            if inner.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


def current_audit() -> dict[str, Any]:
    """What is kept beside the record of the guarded call in progress, for a person (``agentguard ls``): entries
    added to this dict inside the body are stored with its outcome (or its release), beside the ``audit`` the
    call was made with. Never part of the key or the fingerprint."""
    claim = active_claim.get()
    if claim is None:
        raise GuardError("current_audit() was called outside a guarded call")
    if claim.notes is None:
        claim.notes = {}
    return claim.notes


# -- answering a request on an event loop ----------------------------------------------------------------------
# What answers each request: an awaitable of its answer (a store's verb hands back its own coroutine, with no frame
# of ours around it), or None where there is nothing to wait for (its answer is None).


def _claim_key(m: Machine, r: ClaimKey) -> Awaitable[Any]:
    return m.store.claim(r.params, r.likely_taken)


def _take_over(m: Machine, r: TakeOver) -> Awaitable[Any]:
    return m.store.take_over(r.params)


def _release_owned(m: Machine, r: ReleaseOwned) -> Awaitable[Any]:
    return m.store.release_owned(r.scope, r.key, r.owner, r.retention)


def _hold(m: Machine, r: Hold) -> Awaitable[Any]:
    return m.store.hold(r.scope, r.key, r.fence)


def _complete(m: Machine, r: Complete) -> Awaitable[Any]:
    return m.store.complete(r.scope, r.key, r.fence, r.state, r.result, r.retention, r.audit)


def _release(m: Machine, r: Release) -> Awaitable[Any]:
    return m.store.release(r.scope, r.key, r.fence, r.retention, r.audit, raised=r.raised, bound=r.bound)


def _run(m: Machine, r: Run) -> Awaitable[Any]:
    return r.fn()


async def _await_news(m: Machine, r: AwaitNews) -> None:
    """One round of waiting for a key another caller holds, with this process's other waiters on it (one of them
    polls the store; where the store announces outcomes, it listens and polls only as a fallback)."""
    call, waiting = r.call, r.waiting
    watcher = waiting.watcher
    if watcher is None:  # waiting from now on: with this process's other waiters on the key, if any
        watcher = waiting.watcher = m.watches.join((call.scope, call.key))
    if watcher.polls and m.announced and not await _listening(m, call, watcher):
        return  # no longer running: look again now
    poll = _machine.POLL_LISTENING if watcher.listened > 0 else waiting.delay * (0.5 + random.random())
    await watcher.wait(poll, waiting.deadline - time.monotonic())
    waiting.delay = min(waiting.delay * 1.6, _machine.POLL_MAX)


async def _listening(m: Machine, call: Call, watcher: Watcher) -> bool:
    """The poller asks the store to announce the key's outcome to this process (once per listener: after a
    reconnect, again). False if the record is no longer running."""
    store: Any = m.store
    if watcher.listened < 0 or (watcher.listened > 0 and watcher.listened == store.listening()):
        return True  # (cannot listen here: it polls)
    got: int = await store.watch(call.scope, call.key, m.watches.heard)
    watcher.listened = got
    return got != 0


def _start_beat(m: Machine, r: StartBeat) -> None:
    m.beats.start(r.claim)


def _stop_beat(m: Machine, r: StopBeat) -> Awaitable[None] | None:
    return m.beats.stop(r.claim)  # (the renewal in flight, if any: awaited before the write that follows)


def _resume_beat(m: Machine, r: ResumeBeat) -> None:
    claim = r.claim
    if claim.beat is None:  # made in a sync tool's thread and never handed to a heartbeat: it starts now
        renewed = claim.renewed
        m.beats.start(claim)
        claim.renewed = renewed
    else:
        claim.beat.resume(claim, asyncio.get_running_loop())


def _pause(m: Machine, r: Pause) -> Awaitable[None]:
    return asyncio.sleep(r.seconds)


_ON_A_LOOP: dict[type[Request], Callable[[Machine, Any], Awaitable[Any] | None]] = {
    ClaimKey: _claim_key, TakeOver: _take_over, ReleaseOwned: _release_owned, Hold: _hold, Complete: _complete,
    Release: _release, Run: _run, AwaitNews: _await_news, StartBeat: _start_beat, StopBeat: _stop_beat,
    ResumeBeat: _resume_beat, Pause: _pause,
}


async def on_a_loop(m: Machine, request: Request) -> Any:
    """``request`` answered on the running loop."""
    step = _ON_A_LOOP[type(request)](m, request)
    return None if step is None else await step


async def run(m: Machine, plan: Plan[T]) -> T:
    """Run ``plan`` on this loop: each request answered here, its answer (or its error) handed back. Once a
    cancellation reached the plan, what it still asks for (undoing a claim) is finished whole."""
    answer: Any = None
    error: BaseException | None = None
    cancelled = False
    while True:
        try:
            request = plan.send(answer) if error is None else plan.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            step = _ON_A_LOOP[type(request)](m, request)
            answer, error = None, None
            if step is not None:  # (None: answered already, with None)
                answer = await uncancellable(step) if cancelled else await step
        except BaseException as exc:
            cancelled = cancelled or isinstance(exc, asyncio.CancelledError)
            answer, error = None, exc


def _run_here(m: Machine, plan: Plan[T]) -> Awaitable[T]:
    """``run``, where the store lives (an in-memory store's plans run on the portal's loop)."""
    return m.portal.arun(run(m, plan)) if m.store.memory else run(m, plan)


async def _recorded(m: Machine, plan: Callable[[Claim, Any], Plan[T]], claim: Claim, arg: Any) -> T:
    """A recording plan (succeed, fail) — no task, no shield on the happy path. If we are cancelled while it
    runs, its statement may or may not have committed: run it again to completion (every write is fenced, so a
    second attempt is harmless), then deliver the cancellation."""
    try:
        return await _run_here(m, plan(claim, arg))
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await uncancellable(_run_here(m, plan(claim, arg)))
        raise


# -- answering a request in a sync tool's thread ---------------------------------------------------------------


# The requests a sync tool's thread answers itself, with the store's statements on a connection of its own
# (``Direct``: the same statements, parameters and answers as the store's verbs of the same names).
_IN_THREAD: dict[type[Request], Callable[[Direct, Any], Any]] = {
    ClaimKey: lambda d, r: d.claim(r.params, r.likely_taken),
    TakeOver: lambda d, r: d.take_over(r.params),
    Complete: lambda d, r: d.complete(r.scope, r.key, r.fence, r.state, r.result, r.retention, r.audit),
    Release: lambda d, r: d.release(r.scope, r.key, r.fence, r.retention, r.audit, raised=r.raised, bound=r.bound),
}


class InThread:
    """Answers a sync call's requests in its own thread where the store can, else on the portal's loop."""

    __slots__ = ("direct", "m")

    def __init__(self, m: Machine, direct: Direct | None) -> None:
        self.m, self.direct = m, direct

    def answer(self, request: Request) -> Any:
        m, direct, kind = self.m, self.direct, type(request)
        if direct is not None and kind in _IN_THREAD:
            try:
                return _IN_THREAD[kind](direct, request)
            except StoreError:
                pass  # the same statement, on the portal: it decides (retries, fails closed)
        if kind is StartBeat:
            m.pending.add(request.claim)  # type: ignore[attr-defined]
            return None
        if kind is StopBeat:
            claim: Claim = request.claim  # type: ignore[attr-defined]
            at = m.pending.take(claim)
            if at is not None:  # its heartbeat never started: nothing to stop, nothing in flight
                claim.renewed = at
                return None
        elif kind is Pause:
            time.sleep(request.seconds)  # type: ignore[attr-defined]
            return None
        return m.portal.run(on_a_loop(m, request))

    def run(self, plan: Plan[T]) -> T:
        answer: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = plan.send(answer) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                answer, error = self.answer(request), None
            except BaseException as exc:
                answer, error = None, exc


# -- the drivers ---------------------------------------------------------------------------------------------


def _replayed(replay: Replay, note: Note | None) -> Any:
    """The replayed outcome (raised, if it is a stored error), noted."""
    if note is not None:
        note.kind, note.detail, note.attempt = REPLAYED, replay.source, replay.record.attempts
    return replay.result()


def _claimed(claim: Claim, note: Note | None) -> Claim:
    if note is not None:
        note.claimed(claim.attempt, claim.took, claim.gone)
    return claim


async def drive(m: Machine, call: Call, body: Callable[[str], Awaitable[T]]) -> tuple[T, bool]:
    """The async driver: the body awaited in the caller's task. (value, replayed)."""
    note = m.observer.begin(call)
    if note is None:
        return await _drive(m, call, body, None)
    try:
        done = await _drive(m, call, body, note)
    except BaseException as exc:
        m.observer.end(note, exc)
        raise
    m.observer.end(note, None)
    return done


async def _drive(m: Machine, call: Call, body: Callable[[str], Awaitable[T]], note: Note | None) -> tuple[T, bool]:
    outcome: Claim | Replay | None = m.cached(call)
    if outcome is None:
        try:
            outcome = await _run_here(m, m.begin(call))
        except StoreError as exc:
            raise m.not_run(call, exc) from exc
    if isinstance(outcome, Replay):
        return _replayed(outcome, note), True
    claim = _claimed(outcome, note)
    token = _key.set(call.key)
    claim_token = active_claim.set(claim)  # for the Operation parameter and current_audit()
    started = time.perf_counter()
    try:
        value = await body(call.key)
    except BaseException as exc:
        if note is not None:
            note.body = time.perf_counter() - started
        failed = await _recorded(m, m.fail, claim, exc)
        if note is not None:
            note.kind, note.detail = failed
        raise
    finally:
        _key.reset(token)
        active_claim.reset(claim_token)
    if note is not None:
        note.body = time.perf_counter() - started
    value = await _recorded(m, m.succeed, claim, value)
    if note is not None:
        note.ran("succeeded")
    return value, False


def drive_sync(m: Machine, call: Call, body: Callable[[str], T]) -> tuple[T, bool]:
    """The sync driver: the body run in the caller's thread. (value, replayed)."""
    note = m.observer.begin(call)
    if note is None:
        return _drive_sync(m, call, body, None)
    try:
        done = _drive_sync(m, call, body, note)
    except BaseException as exc:
        m.observer.end(note, exc)
        raise
    m.observer.end(note, None)
    return done


def _drive_sync(m: Machine, call: Call, body: Callable[[str], T], note: Note | None) -> tuple[T, bool]:
    outcome: Claim | Replay | None = m.cached(call)
    here = InThread(m, None if m.store.memory else m.direct())
    if outcome is None:
        try:
            outcome = (m.portal.run(run(m, m.begin(call))) if m.store.memory else here.run(m.begin(call)))
        except StoreError as exc:
            raise m.not_run(call, exc) from exc
    if isinstance(outcome, Replay):
        return _replayed(outcome, note), True
    claim = _claimed(outcome, note)
    token = _key.set(call.key)
    claim_token = active_claim.set(claim)
    started = time.perf_counter()
    try:
        value = body(call.key)
    except BaseException as exc:
        if note is not None:
            note.body = time.perf_counter() - started
        failed = m.portal.run(run(m, m.fail(claim, exc))) if m.store.memory else here.run(m.fail(claim, exc))
        if note is not None:
            note.kind, note.detail = failed
        raise
    finally:
        _key.reset(token)
        active_claim.reset(claim_token)
    if note is not None:
        note.body = time.perf_counter() - started
    value = m.portal.run(run(m, m.succeed(claim, value))) if m.store.memory else here.run(m.succeed(claim, value))
    if note is not None:
        note.ran("succeeded")
    return value, False
