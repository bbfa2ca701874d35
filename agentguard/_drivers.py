"""The drivers of a guarded call: the async one (the body awaited in the caller's task) and the sync one (the
body run in the caller's thread, the store calls sent to the guard's portal loop, or made in that thread where
the store has them there: ``_here``). A few lines each around the engine's decisions (``Engine.begin``,
``succeed``, ``fail``), and the one place a call's ``Note`` is filled for the ledger and OpenTelemetry
(``_observe``): with nothing observing, no note is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ._calls import Call, Claim, Replay
from ._context import _key
from ._errors import StoreError
from ._here import begin_here, succeed_here
from ._lease import new_owner
from ._observe import Note, Observer
from .stores._attempts import REPLAYED

if TYPE_CHECKING:
    from ._here import PendingBeats
    from ._portal import Portal
    from .stores import Store
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


async def _recorded(step: Callable[[Claim, Any], Awaitable[T]], claim: Claim, arg: Any) -> T:
    """Run a recording step (succeed, fail) directly — no task, no shield on the happy path. If we are
    cancelled while it runs, its statement may or may not have committed: run it again to completion (every
    write is fenced, so a second attempt is harmless), then deliver the cancellation."""
    try:
        return await step(claim, arg)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await uncancellable(step(claim, arg))
        raise


class Drivers:
    """The drivers, mixed into ``Engine`` (which decides; these only move the body)."""

    store: Store
    portal: Portal
    observer: Observer

    if TYPE_CHECKING:
        def cached(self, call: Call) -> Replay | None: ...

        async def begin(self, call: Call, owner: str | None = None) -> Claim | Replay: ...

        @staticmethod
        def not_run(call: Call, exc: StoreError) -> StoreError: ...

        async def fail(self, claim: Claim, exc: BaseException) -> tuple[str, str]: ...

        async def succeed(self, claim: Claim, value: Any) -> Any: ...

        def direct(self) -> Direct | None: ...

        pending: PendingBeats

    async def drive(self, call: Call, body: Callable[[str], Awaitable[T]]) -> tuple[T, bool]:
        note = self.observer.begin(call)
        if note is None:
            return await self._drive(call, body, None)
        try:
            done = await self._drive(call, body, note)
        except BaseException as exc:
            self.observer.end(note, exc)
            raise
        self.observer.end(note, None)
        return done

    async def _drive(self, call: Call, body: Callable[[str], Awaitable[T]], note: Note | None) -> tuple[T, bool]:
        memory = self.store.memory
        outcome: Claim | Replay | None = self.cached(call)
        if outcome is None:
            try:
                outcome = await (self.portal.arun(self.begin(call)) if memory else self.begin(call))
            except StoreError as exc:
                raise self.not_run(call, exc) from exc
        if isinstance(outcome, Replay):
            if note is not None:
                note.kind, note.detail, note.attempt = REPLAYED, outcome.source, outcome.record.attempts
            return outcome.result(), True
        claim = outcome
        if note is not None:
            note.claimed(claim.attempt, claim.took)
        token = _key.set(call.key)
        claim_token = active_claim.set(claim)  # for the Operation parameter and current_audit()
        started = time.perf_counter()
        try:
            value = await body(call.key)
        except BaseException as exc:
            if note is not None:
                note.body = time.perf_counter() - started
            failed = await _recorded(self._on_portal(self.fail) if memory else self.fail, claim, exc)
            if note is not None:
                note.kind, note.detail = failed
            raise
        finally:
            _key.reset(token)
            active_claim.reset(claim_token)
        if note is not None:
            note.body = time.perf_counter() - started
        value = await _recorded(self._on_portal(self.succeed) if memory else self.succeed, claim, value)
        if note is not None:
            note.ran("succeeded")
        return value, False

    def _on_portal(self, step: Callable[[Claim, Any], Coroutine[Any, Any, T]]) -> Callable[[Claim, Any], Awaitable[T]]:
        """A recording step run on the portal's loop, where an in-memory store lives."""
        return lambda claim, arg: self.portal.arun(step(claim, arg))

    def drive_sync(self, call: Call, body: Callable[[str], T]) -> tuple[T, bool]:
        note = self.observer.begin(call)
        if note is None:
            return self._drive_sync(call, body, None)
        try:
            done = self._drive_sync(call, body, note)
        except BaseException as exc:
            self.observer.end(note, exc)
            raise
        self.observer.end(note, None)
        return done

    def _drive_sync(self, call: Call, body: Callable[[str], T], note: Note | None) -> tuple[T, bool]:
        portal = self.portal
        outcome: Claim | Replay | None = self.cached(call)
        direct = self.direct() if outcome is None else None
        owner: str | None = None
        if direct is not None:  # in this thread, where it can be answered so (see _here)
            owner = new_owner()
            outcome = begin_here(self, direct, call, owner)  # type: ignore[arg-type]
        if outcome is None:
            try:
                outcome = portal.run(self.begin(call, owner))
            except StoreError as exc:
                raise self.not_run(call, exc) from exc
        if isinstance(outcome, Replay):
            if note is not None:
                note.kind, note.detail, note.attempt = REPLAYED, outcome.source, outcome.record.attempts
            return outcome.result(), True
        if note is not None:
            note.claimed(outcome.attempt, outcome.took)
        token = _key.set(call.key)
        claim_token = active_claim.set(outcome)
        started = time.perf_counter()
        try:
            value = body(call.key)
        except BaseException as exc:
            if note is not None:
                note.body = time.perf_counter() - started
            failed = portal.run(self.pending.general(self.fail, outcome, exc))
            if note is not None:
                note.kind, note.detail = failed
            raise
        finally:
            _key.reset(token)
            active_claim.reset(claim_token)
        if note is not None:
            note.body = time.perf_counter() - started
        if direct is not None and (done := succeed_here(self, direct, outcome, value)) is not None:  # type: ignore[arg-type]
            value = done[0]
        else:
            value = portal.run(self.pending.general(self.succeed, outcome, value))
        if note is not None:
            note.ran("succeeded")
        return value, False
