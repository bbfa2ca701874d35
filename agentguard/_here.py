"""A sync tool's claim and completion made in its own thread, where the store has them there (a SQLite file:
``stores/_direct.py``; Postgres through psycopg: ``stores/_direct_pg.py``), instead of a round trip through
the guard's portal loop.

A shortcut beside the general path (``Engine.begin`` and ``Engine.succeed`` on the portal), taking only the
answers that path would take at once, with the engine's own pieces (``claim_params``, ``answered``,
``completed``): a claim won, or a completed record replayed. Anything else — a record running or released, a
failure of the store, a body long enough for its heartbeat to have started, a result that cannot be stored, a
claim no longer ours — returns None, and the general path decides, redoing the statement (a claim by insert,
a fenced completion: both harmless to repeat). ``tests/test_direct.py`` and ``tests/test_direct_pg.py`` prove
the two paths equal.

Such a claim is renewed like any other, by the heartbeat on the portal's loop, but it is handed over only if
its body still runs at the heartbeat's next tick (:class:`PendingBeats`), so a short body wakes no other
thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ._calls import Call, Claim, Replay
from ._errors import StoreError
from .stores import SUCCEEDED

if TYPE_CHECKING:
    from ._engine import Engine
    from .stores._protocols import Direct

T = TypeVar("T")


def begin_here(engine: Engine, direct: Direct, call: Call, owner: str) -> Claim | Replay | None:
    """The claim in this thread, made as ``owner``: ours (pending its heartbeat), a replay, or None. (After a
    failure the general path claims as the same owner: a claim that committed with its answer lost — a
    connection killed at that moment — is then found to be ours, not another caller's.)"""
    try:
        got = direct.claim(engine.claim_params(call, owner), likely_taken=call in engine.replaying)
    except StoreError:
        return None
    if isinstance(got, int):
        engine.replaying.discard(call)
        engine.events.emit("claimed", call, 1)
        claim = Claim(call, got, 1, got)
        engine.pending.add(claim)
        return claim
    return None if got is None else engine.answered(call, got)  # (raises on other arguments)


def succeed_here(engine: Engine, direct: Direct, claim: Claim, value: Any) -> tuple[Any] | None:
    """The completion in this thread, for a claim whose heartbeat never started: (the decoded stored
    value,), or None."""
    call = claim.call
    try:
        encoded, decoded = call.codec.store(value)
    except Exception:  # (not storable: the general path records that, with its heartbeat)
        return None
    at = engine.pending.take(claim)
    if at is None:
        return None  # its heartbeat started: the general path stops it first
    stored_at = time.monotonic()  # before the database computes expires_at: the cache entry dies first
    try:
        recorded = direct.complete(call.scope, call.key, claim.fence, SUCCEEDED, encoded, engine.retention,
                                   claim.audit())
    except StoreError:
        recorded = False
    if not recorded:
        engine.pending.add(claim, at)  # (the general path decides, with its heartbeat)
        return None
    engine.completed(claim, encoded, stored_at)
    return (decoded,)


class PendingBeats:
    """Claims made in sync tools' own threads, each handed to the heartbeat on the portal's loop at the first
    tick (every lease/6) that finds its body still running, with the time it was claimed: its lease is then
    renewed by half of it, as any other's. The portal is woken once per loop, to start the ticks."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._claims: dict[Claim, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the portal's loop the ticks run on

    def add(self, claim: Claim, at: float | None = None) -> None:
        """``claim``, made at ``at`` (monotonic; now if None), pending its heartbeat."""
        loop = self._engine.portal.loop()
        with self._lock:
            self._claims[claim] = time.monotonic() if at is None else at
            if loop is self._loop:
                return
            self._loop = loop  # (a portal stopped and started again has a new loop)
        loop.call_soon_threadsafe(self._tick, loop, False)

    def take(self, claim: Claim) -> float | None:
        """When ``claim`` was made, if it was still pending (and is no longer): no heartbeat renews it."""
        with self._lock:
            return self._claims.pop(claim, None)

    def _tick(self, loop: asyncio.AbstractEventLoop, hand_over: bool = True) -> None:
        if loop is not self._loop:
            return
        if hand_over:
            with self._lock:
                claims, self._claims = self._claims, {}
            for claim, at in claims.items():
                self._engine.beats.start(claim)
                claim.renewed = at  # (the loop's clock is time.monotonic)
        loop.call_later(self._engine.lease / 6, self._tick, loop)

    async def general(self, step: Callable[[Claim, T], Coroutine[Any, Any, Any]], claim: Claim, arg: T) -> Any:
        """``step`` (the engine's succeed or fail) on the portal's loop for a claim that may still be pending:
        on its heartbeat first, as the general path expects (it stops it, or renews it through an outage)."""
        with self._lock:
            at = self._claims.pop(claim, None)
        if at is not None:
            self._engine.beats.start(claim)
            claim.renewed = at
        return await step(claim, arg)
