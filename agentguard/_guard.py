"""Guard: configuration, the call state machine (written once), and the ``once`` decorator.

derive -> claim -> replay | conflict | run -> record | release. ``_begin``, ``_succeed`` and ``_fail`` hold
every decision; the async driver and the sync driver are a few lines each and only differ in where the
body runs (the caller's task, or the caller's thread with store calls sent to the portal loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import itertools
import json
import logging
import os
import random
import time
import typing
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from . import _codec
from ._cache import ReplayCache
from ._codec import Codec
from ._context import (
    DEFAULT_SCOPE,
    MAX_OPERATION,
    MAX_SCOPE,
    MAX_TASK_ID,
    _key,
    check_id,
    check_task_id,
    current_task,
)
from ._context import task as _task_ctx
from ._errors import (
    GuardError,
    InProgressError,
    KeyReuseError,
    LeaseLostError,
    MissingTaskError,
    OutcomeUnknownError,
    StoreError,
)
from ._frameworks import made_by
from ._keys import FlatSignature, argument_hashes, derive_key, fingerprint, hashes_json, operation_name
from ._operation import Operation, Reconcile
from ._portal import Portal
from .stores import FAILED, RUNNING, SUCCEEDED, Listing, Record, SQLStore

log = logging.getLogger("agentguard")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

DEFAULT_URL = "sqlite+aiosqlite:///agentguard.db"
DEFAULT_LEASE = 30.0
DEFAULT_RETENTION = timedelta(days=7)
_UNSET: Any = object()
_active_claim: contextvars.ContextVar[_Claim | None] = contextvars.ContextVar("agentguard_claim", default=None)
_new = tuple.__new__  # builds a Record without its NamedTuple's Python-level __new__ (hot path)
_REPLAYING_MAX = 4096  # tasks remembered as replaying (see Guard._begin)
_MAX_VANISHED = 5  # bounded retries when the winner's row vanishes between our failed insert and read


# Owner tokens must be unique across every process of a fleet (a claimer recognises its own lost-reply
# claim by it): a random per-process prefix, renewed in a forked child, and a counter. Fences only need to
# start at an unpredictable point per key: a PRNG seeded from the OS, reseeded in a forked child.
_rng = random.Random()
_owner_prefix = os.urandom(6).hex()
_owner_count = itertools.count()


def _after_fork() -> None:
    global _owner_prefix
    _owner_prefix = os.urandom(6).hex()
    _rng.seed(os.urandom(16))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


EventKind = Literal[
    "claimed", "completed", "replayed", "takeover", "released", "waiting", "key_reuse", "lease_lost",
    "not_stored",
]


@dataclass(frozen=True, slots=True)
class GuardEvent:
    """What happened to one guarded call; passed to the ``on_event`` hook and logged."""

    kind: EventKind
    scope: str
    task_id: str
    operation: str
    key: str
    attempt: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """The result of :meth:`Guard.run`: the (decoded, stored) value and whether it was a replay."""

    value: T
    replayed: bool
    key: str
    operation: str
    task_id: str
    scope: str


_LEVEL = {
    "claimed": logging.DEBUG, "completed": logging.DEBUG, "waiting": logging.DEBUG,
    "replayed": logging.INFO, "takeover": logging.INFO, "released": logging.INFO,
    "key_reuse": logging.WARNING, "lease_lost": logging.WARNING, "not_stored": logging.ERROR,
}


@dataclass(slots=True)
class _Call:
    scope: str
    task_id: str
    operation: str
    key: str
    fp_args: Mapping[str, Any]
    fingerprint: str
    codec: Codec
    cache_errors: tuple[type[BaseException], ...]
    on_conflict: str
    wait_timeout: float | None
    tool: str
    audit: str | None = None
    arguments: str | None = None  # stored only for resumable tools
    _hashes: dict[str, str] | None = None
    _hashes_json: str | None = None
    flat: tuple[FlatSignature, list[str]] | None = None  # the arguments' canonical JSON, if all are flat

    @property
    def arg_hashes(self) -> dict[str, str]:
        """One short hash per argument (stored at the claim, so a reuse error can name what differs);
        computed only when a claim or an error needs it, never on a cached replay."""
        if self._hashes is None:
            self._hashes = argument_hashes(self.fp_args) if self.flat is None else self.flat[0].hashes(self.flat[1])
        return self._hashes

    @property
    def arg_hashes_json(self) -> str:
        if self._hashes_json is None:
            flat = self.flat
            self._hashes_json = hashes_json(self.arg_hashes) if flat is None else flat[0].hashes_json(flat[1])
        return self._hashes_json


class _Claim:
    __slots__ = ("attempt", "beat", "call", "fence", "origin", "renewal", "renewed")

    def __init__(self, call: _Call, fence: int, attempt: int, origin: int) -> None:
        self.call = call
        self.fence = fence
        self.attempt = attempt
        self.origin = origin
        self.beat: _Heartbeat | None = None
        self.renewed = 0.0  # loop time of the claim or of its last renewal
        self.renewal: asyncio.Task[None] | None = None


class _Heartbeat:
    """One timer per guard and event loop renews every claim held there whose lease is a third spent.

    A claim costs a dict insert and a dict delete; nothing runs unless some body outlives lease/3. The
    timer ticks every lease/6 while claims are held, so a lease is renewed before half of it is spent.
    """

    __slots__ = ("claims", "guard", "loop", "timer")

    def __init__(self, guard: Guard, loop: asyncio.AbstractEventLoop) -> None:
        self.guard = guard
        self.loop = weakref.ref(loop)  # weak: it is the value of a WeakKeyDictionary keyed by the loop
        self.claims: dict[_Claim, None] = {}
        self.timer: asyncio.TimerHandle | None = None

    def add(self, claim: _Claim, loop: asyncio.AbstractEventLoop) -> None:
        claim.beat = self
        claim.renewed = loop.time()
        self.claims[claim] = None
        if self.timer is None:
            self.timer = loop.call_later(self.guard._lease / 6, self._tick)

    def resume(self, claim: _Claim, loop: asyncio.AbstractEventLoop) -> None:
        """Renew ``claim`` again (while a write after its body is retried through an outage), keeping the
        time of its last renewal."""
        self.claims[claim] = None
        if self.timer is None:
            self.timer = loop.call_later(self.guard._lease / 6, self._tick)

    def _tick(self) -> None:
        self.timer = None
        if not self.claims:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = now - self.guard._lease / 3
        for claim in list(self.claims):
            if claim.renewed <= due and (claim.renewal is None or claim.renewal.done()):
                claim.renewed = now
                claim.renewal = loop.create_task(self.guard._renew(claim))
        self.timer = loop.call_later(self.guard._lease / 6, self._tick)


class _Replay:
    __slots__ = ("call", "record")

    def __init__(self, call: _Call, record: Record) -> None:
        self.call = call
        self.record = record

    def result(self) -> Any:
        rec, call = self.record, self.call
        assert rec.result is not None
        if rec.state == FAILED:
            raise _codec.decode_error(rec.result, call.cache_errors)
        try:
            return call.codec.decode(rec.result)
        except Exception as exc:  # the stored value no longer fits the tool's return type
            raise GuardError(
                f"the stored result of {call.operation!r} cannot be decoded as {call.codec.annotation!r} "
                f"({exc}); the tool was not run again",
                key=call.key, task_id=call.task_id, operation=call.operation, scope=call.scope,
            ) from None


async def _uncancellable(aw: Awaitable[T]) -> T:
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


async def _recorded(step: Callable[[Any, Any], Awaitable[T]], claim: Any, arg: Any) -> T:
    """Run a recording step (complete, release) directly — no task, no shield on the happy path. If we
    are cancelled while it runs, its statement may or may not have committed: run it again to completion
    (every write is fenced, so a second attempt is harmless), then deliver the cancellation."""
    try:
        return await step(claim, arg)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await _uncancellable(step(claim, arg))
        raise


def _seconds(value: float | timedelta, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
        raise ValueError(f"{what} must be a positive number of seconds or a timedelta, got {value!r}")
    return float(seconds)


class Guard:
    """Runs side-effecting tools at most once per (scope, task, operation) and replays the outcome.

    ``url``: ``sqlite+aiosqlite:///path.db`` (default ``$AGENTGUARD_URL``, else ``agentguard.db`` in the
    working directory), ``sqlite+aiosqlite://`` for an in-memory store in tests, or
    ``postgresql+asyncpg://user@host/db`` for a fleet of workers.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        lease: float | timedelta = DEFAULT_LEASE,
        retention: float | timedelta = DEFAULT_RETENTION,
        on_conflict: Literal["wait", "raise"] = "wait",
        wait_timeout: float | timedelta | None = None,
        on_event: Callable[[GuardEvent], None] | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        sqlite_synchronous: str = "FULL",
        pg_synchronous_commit: str | None = None,
        cache_size: int = 1024,
        outage_window: float | timedelta | None = None,
    ) -> None:
        url = url or os.environ.get("AGENTGUARD_URL") or DEFAULT_URL
        self._lease = _seconds(lease, "lease")
        self._retention = _seconds(retention, "retention")
        # How long a write after the body ran (completion, release, a step's result) is retried through a
        # store outage before the claim is left to expire: half the lease unless told otherwise, so the write
        # lands while the claim is still ours (the heartbeat renews it meanwhile when the store lets it).
        if outage_window is None:
            self._window = self._lease / 2
        else:
            self._window = 0.0 if outage_window in (0, timedelta(0)) else _seconds(outage_window, "outage_window")
            if self._window > self._lease:
                raise ValueError(f"outage_window ({self._window:g}s) must not exceed the lease ({self._lease:g}s): "
                                 "past the lease another worker may take the claim over")
        if on_conflict not in ("wait", "raise"):
            raise ValueError(f"on_conflict must be 'wait' or 'raise', got {on_conflict!r}")
        self._on_conflict = on_conflict
        self._wait_timeout = None if wait_timeout is None else _seconds(wait_timeout, "wait_timeout")
        self._on_event = on_event
        self._store = SQLStore(
            url, pool_size=pool_size, connect_timeout=connect_timeout, sqlite_synchronous=sqlite_synchronous,
            pg_synchronous_commit=pg_synchronous_commit,
        )
        self._portal = Portal()
        self._codecs: dict[Any, Codec] = {}
        self._cache = ReplayCache(cache_size)
        self._resumable: dict[str, Callable[..., Any]] = {}
        self._beats: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Heartbeat] = weakref.WeakKeyDictionary()
        self._beat: _Heartbeat | None = None
        # Tasks whose last call through this guard was a replay (a resumed agent replaying its history):
        # their next call is read with a plain SELECT first (see _begin). Advisory, bounded.
        self._replaying: dict[tuple[str, str], None] = {}

    # -- configuration ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._store.url

    @property
    def backend(self) -> str:
        return self._store.backend

    @property
    def lease(self) -> float:
        return self._lease

    @property
    def retention(self) -> float:
        return self._retention

    @property
    def outage_window(self) -> float:
        return self._window

    def __repr__(self) -> str:
        return f"Guard(backend={self.backend!r}, lease={self._lease}, on_conflict={self._on_conflict!r})"

    # -- lifecycle ----------------------------------------------------------------------------------

    async def __aenter__(self) -> Guard:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __enter__(self) -> Guard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def aclose(self) -> None:
        """Dispose the engines of this loop and of the portal. The guard can be used again afterwards."""
        await self._store.dispose()
        if self._portal.started:
            await self._portal.arun(self._store.dispose())
            self._portal.stop()

    def close(self) -> None:
        """Close from sync code: disposes the portal's engine and stops the portal."""
        if self._portal.started:
            self._portal.run(self._store.dispose())
            self._portal.stop()

    # -- store passthroughs ---------------------------------------------------------------------------

    async def _store_call(self, coro: Coroutine[Any, Any, T]) -> T:
        # An in-memory SQLite database lives on one connection, so it lives on the portal loop.
        return await (self._portal.arun(coro) if self._store.memory else coro)

    async def sweep(self, batch: int = 1000) -> int:
        """Delete records past their retention, in batches of ``batch``. Returns how many were deleted."""
        if batch < 1:
            raise ValueError("batch must be at least 1")
        return await self._store_call(self._store.sweep(batch))

    async def records(
        self, *, scope: str | None = None, task_id: str | None = None, limit: int = 100
    ) -> Sequence[Listing]:
        """The most recently updated records, for audit (``agentguard ls``)."""
        return await self._store_call(self._store.listing(scope=scope, task_id=task_id, limit=limit))

    async def ensure_schema(self) -> None:
        await self._store_call(self._store.ensure_schema())

    # -- events ---------------------------------------------------------------------------------------

    def _emit(self, kind: EventKind, call: _Call, attempt: int, detail: str = "") -> None:
        level = _LEVEL[kind]
        if log.isEnabledFor(level):
            log.log(level, "%s %s task=%s scope=%s attempt=%d %s", kind, call.operation, call.task_id,
                    call.scope, attempt, detail)
        if self._on_event is not None:
            try:
                self._on_event(GuardEvent(kind, call.scope, call.task_id, call.operation, call.key, attempt, detail))
            except Exception:
                log.exception("the on_event hook raised; ignored")

    # -- the state machine (written once) -----------------------------------------------------------

    def _claimed(self, call: _Call, fence: int, attempt: int, origin: int) -> _Claim:
        claim = _Claim(call, fence, attempt, origin)
        loop = asyncio.get_running_loop()
        beat = self._beat
        if beat is None or beat.loop() is not loop:
            beat = self._beats.get(loop)
            if beat is None:
                beat = self._beats[loop] = _Heartbeat(self, loop)
            self._beat = beat  # the loop of the last claim: a cheap check for the next one
        beat.add(claim, loop)
        return claim

    async def _renew(self, claim: _Claim) -> None:
        # A lease is not a lock: renew it while the body runs; every write stays fenced anyway.
        call = claim.call
        try:
            if not await self._store.renew(call.scope, call.key, claim.fence, self._lease):
                self._emit("lease_lost", call, claim.attempt, "renewal found the claim taken over")
        except GuardError as exc:
            claim.renewed = float("-inf")  # due again at the next tick, not a third of a lease later
            log.warning("could not renew the lease of %s: %s", call.operation, exc)

    @staticmethod
    def _stop_heartbeat(claim: _Claim) -> asyncio.Task[None] | None:
        """Stop renewing; returns the renewal still in flight (one statement at most), to be awaited."""
        if claim.beat is not None:
            claim.beat.claims.pop(claim, None)
        renewal = claim.renewal
        return renewal if renewal is not None and not renewal.done() else None

    def _reuse_error(self, call: _Call, rec: Record) -> KeyReuseError:
        try:
            stored: dict[str, str] = json.loads(rec.arg_hashes)
        except ValueError:
            stored = {}
        names = sorted(n for n in stored.keys() | call.arg_hashes.keys() if stored.get(n) != call.arg_hashes.get(n))
        differ = ", ".join(names) or "unknown arguments"
        self._emit("key_reuse", call, rec.attempts, differ)
        return KeyReuseError(
            f"{call.operation!r} in task {call.task_id!r} was already called with different arguments "
            f"(differing: {differ}); the tool was not run. Use a new task id for a different operation.",
            differing=names, key=call.key, task_id=call.task_id, operation=call.operation, scope=call.scope,
        )

    def _in_progress(self, call: _Call, rec: Record, why: str) -> InProgressError:
        return InProgressError(
            f"{call.operation!r} in task {call.task_id!r} is being run by another caller (attempt "
            f"{rec.attempts}); {why}. This call did not run it; retry the same call shortly.",
            key=call.key, task_id=call.task_id, operation=call.operation, scope=call.scope,
        )

    def _cached(self, call: _Call) -> _Replay | None:
        """A replay served from the in-process cache: no round trip (raises on a fingerprint mismatch)."""
        rec = self._cache.get(call.scope, call.key)
        if rec is None:
            return None
        if rec.fingerprint != call.fingerprint:
            raise self._reuse_error(call, rec)
        self._emit("replayed", call, rec.attempts, "from the in-process cache")
        return _Replay(call, rec)

    def _remember(self, claim: _Claim, state: str, stored: str, started: float) -> None:
        call = claim.call
        if self._cache.maxsize:
            rec: Record = _new(Record, (call.scope, call.key, state, claim.fence, call.fingerprint,
                                        call.arg_hashes_json, stored, claim.attempt, None, call.task_id,
                                        call.operation, False, False, self._retention, claim.origin))
            self._cache.put(rec, started + self._retention)

    def _replayed(self, call: _Call, rec: Record) -> _Replay:
        """A terminal record with our fingerprint, read from the store: replay it (and remember the task)."""
        self._emit("replayed", call, rec.attempts)
        self._cache.put(rec, time.monotonic() - 1.0 + rec.ttl)  # margin: the read's round trip
        if self._store.read_is_cheaper:
            replaying = self._replaying
            if len(replaying) >= _REPLAYING_MAX:
                replaying.clear()
            replaying[(call.scope, call.task_id)] = None
        return _Replay(call, rec)

    async def _begin(self, call: _Call) -> _Claim | _Replay:
        store = self._store
        if store.read_is_cheaper and (call.scope, call.task_id) in self._replaying:
            # The task's previous call here was a replay, so this one likely is too: a plain SELECT costs
            # less than the claim statement (Postgres). Only a completed record is acted on; anything else
            # (none, running, released, past retention) goes to the claim below, which decides.
            rec = await store.read(call.scope, call.key)
            if rec is not None and rec.state in (SUCCEEDED, FAILED) and not rec.expired:
                if rec.fingerprint != call.fingerprint:
                    raise self._reuse_error(call, rec)
                return self._replayed(call, rec)
            self._replaying.pop((call.scope, call.task_id), None)
        owner = f"{_owner_prefix}{next(_owner_count):x}"  # an owner token (see _owner_prefix)
        params: dict[str, Any] = {
            "scope": call.scope, "key": call.key, "task_id": call.task_id, "operation": call.operation,
            "fingerprint": call.fingerprint, "arg_hashes": call.arg_hashes_json,
            "owner": owner, "lease": self._lease, "retention": self._retention, "audit": call.audit,
            "tool": call.tool, "arguments": call.arguments,
            # Fences start at a random point so they never repeat for a key, not even after a sweep.
            "fence": _rng.getrandbits(62),
        }
        deadline: float | None = None
        delay, vanished = 0.01, 0
        while True:
            # Claim by insert, never check-then-insert: one statement decides.
            try:
                got = await store.claim(params)
            except asyncio.CancelledError:
                await self._undo_claim(call, owner)
                raise
            if isinstance(got, int):
                self._emit("claimed", call, 1)
                return self._claimed(call, got, 1, got)
            rec = got
            if rec is None:
                # The winner's row vanished (swept) between our insert and our read: claim again.
                vanished += 1
                if vanished >= _MAX_VANISHED:
                    raise InProgressError(
                        f"the record of {call.operation!r} kept vanishing while being claimed; the tool was "
                        "not run. Retry the same call shortly.",
                        key=call.key, task_id=call.task_id, operation=call.operation, scope=call.scope,
                    )
                continue
            if rec.owner == owner and rec.state == RUNNING:
                # Our own insert committed but its reply was lost to a reconnect.
                self._emit("claimed", call, rec.attempts)
                return self._claimed(call, rec.fence, rec.attempts, rec.origin)
            stale = rec.expired and not rec.live  # past retention: a new operation
            if not stale:
                if rec.fingerprint != call.fingerprint:
                    raise self._reuse_error(call, rec)
                if rec.state in (SUCCEEDED, FAILED):
                    return self._replayed(call, rec)
            if stale or not rec.live:
                try:
                    took = await store.take_over({**params, "fence": rec.fence, "reset": 1 if stale else 0})
                except asyncio.CancelledError:
                    await self._undo_claim(call, owner)
                    raise
                if took is not None:
                    attempt = 1 if stale else rec.attempts + 1
                    self._emit("takeover" if not stale else "claimed", call, attempt,
                               f"previous state {rec.state}" if not stale else "previous record expired")
                    return self._claimed(call, took[0], attempt, took[1])
                continue  # another caller took it first: look again
            if call.on_conflict == "raise":
                raise self._in_progress(call, rec, "on_conflict='raise'")
            now = asyncio.get_running_loop().time()
            if deadline is None:
                deadline = now + call.wait_timeout if call.wait_timeout is not None else float("inf")
                self._emit("waiting", call, rec.attempts)
            if now >= deadline:
                raise self._in_progress(call, rec, f"waited {call.wait_timeout:g}s for it to finish")
            await asyncio.sleep(min(delay * (0.5 + random.random()), max(deadline - now, 0.001)))
            delay = min(delay * 1.6, 0.5)

    async def _undo_claim(self, call: _Call, owner: str) -> None:
        """We were cancelled while claiming: if the claim committed, it is ours (owner token) — release it
        rather than leave it held until the lease runs out."""
        with contextlib.suppress(Exception):
            await _uncancellable(self._store.release_owned(call.scope, call.key, owner, self._retention))

    async def _settled(
        self, claim: _Claim, what: str, write: Callable[[], Awaitable[T]], *, heartbeat: bool = True
    ) -> T:
        """A store write made after the body ran: the completion, a release, a step's result.

        Each is fenced and idempotent for its fence, so through a short outage it is redone (each attempt
        reconnecting, with backoff) until it lands or ``outage_window`` passes; giving up sooner would leave
        the claim held and let a takeover run the body a second time. ``heartbeat``: the body is over and its
        heartbeat stopped, so renew the lease while waiting (stopped again before each attempt, so a renewal
        never races the write). Only a longer outage ends in ``StoreError(body_ran=True)``.
        """
        try:
            return await write()
        except StoreError as exc:
            if not exc.transient or self._window <= 0:
                raise
            error = exc
        call = claim.call
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._window
        log.warning("the store failed while %s of %s (%s); retrying for up to %gs", what, call.operation,
                    error, self._window)
        delay = 0.05
        while True:
            if heartbeat and claim.beat is not None:
                claim.beat.resume(claim, loop)
            await asyncio.sleep(min(delay * (0.5 + random.random()), max(deadline - loop.time(), 0.0)))
            if heartbeat and (renewal := self._stop_heartbeat(claim)) is not None:
                await renewal
            try:
                result = await write()
            except StoreError as exc:
                if not exc.transient or loop.time() >= deadline:
                    raise StoreError(
                        f"{exc} (retried for {self._window:g}s, the guard's outage_window)", body_ran=True,
                        transient=exc.transient, key=call.key, task_id=call.task_id, operation=call.operation,
                        scope=call.scope,
                    ) from exc
                delay = min(delay * 2, 1.0)
                continue
            log.info("%s of %s landed after the store came back", what.capitalize(), call.operation)
            return result

    async def _succeed(self, claim: _Claim, value: Any) -> Any:
        call = claim.call
        if (renewal := self._stop_heartbeat(claim)) is not None:
            await renewal
        try:
            encoded, decoded = call.codec.store(value)
        except (TypeError, ValueError) as exc:
            self._emit("not_stored", call, claim.attempt, str(exc))
            raise GuardError(
                f"the result of {call.operation!r} could not be stored ({exc}); the tool body already ran, so "
                "the claim is left held: after the lease expires the next caller takes over with the same "
                "downstream key",
                key=call.key, task_id=call.task_id, operation=call.operation, scope=call.scope,
            ) from None
        started = time.monotonic()  # before the database computes expires_at: the cache entry dies first
        store = self._store
        if not await self._settled(claim, "storing the result", lambda: store.complete(
            call.scope, call.key, claim.fence, SUCCEEDED, encoded, self._retention
        )):
            raise self._lease_lost(call, claim)
        self._remember(claim, SUCCEEDED, encoded, started)
        self._emit("completed", call, claim.attempt)
        return decoded

    def _lease_lost(self, call: _Call, claim: _Claim) -> LeaseLostError:
        self._emit("lease_lost", call, claim.attempt, "result refused")
        return LeaseLostError(
            f"the lease on {call.operation!r} in task {call.task_id!r} expired and another worker took over; "
            "this worker's outcome was not stored and the other worker's stands",
            key=call.key, task_id=call.task_id, operation=call.operation, scope=call.scope,
        )

    async def _fail(self, claim: _Claim, exc: BaseException) -> None:
        call = claim.call
        if (renewal := self._stop_heartbeat(claim)) is not None:
            await renewal
        if isinstance(exc, Exception) and call.cache_errors and isinstance(exc, call.cache_errors):
            stored = _codec.encode_error(exc)
            started = time.monotonic()
            store = self._store
            if not await self._settled(claim, "storing the cached error", lambda: store.complete(
                call.scope, call.key, claim.fence, FAILED, stored, self._retention
            )):
                raise self._lease_lost(call, claim) from exc
            self._remember(claim, FAILED, stored, started)
            self._emit("completed", call, claim.attempt, f"cached error {type(exc).__name__}")
            return
        # Released in its own statement on a fresh connection, never inside a failed transaction.
        store = self._store
        try:
            released = await self._settled(claim, "releasing the claim", lambda: store.release(
                call.scope, call.key, claim.fence, self._retention
            ))
        except GuardError as store_exc:
            exc.add_note(f"agentguard: the claim could not be released ({store_exc}); it expires with its lease")
            return
        if released:
            self._emit("released", call, claim.attempt, type(exc).__name__)
        else:
            self._emit("lease_lost", call, claim.attempt, "release refused")

    # -- drivers --------------------------------------------------------------------------------------

    async def _drive(
        self, call: _Call, body: Callable[[str], Awaitable[T]], *, multi_step: bool = False
    ) -> tuple[T, bool]:
        memory = self._store.memory
        outcome: _Claim | _Replay | None = self._cached(call)
        if outcome is None:
            outcome = await (self._portal.arun(self._begin(call)) if memory else self._begin(call))
        if isinstance(outcome, _Replay):
            return outcome.result(), True
        claim = outcome
        token = _key.set(call.key)
        claim_token = _active_claim.set(claim) if multi_step else None  # for the Operation parameter
        try:
            value = await body(call.key)
        except BaseException as exc:
            await _recorded(self._on_portal(self._fail) if memory else self._fail, claim, exc)
            raise
        finally:
            _key.reset(token)
            if claim_token is not None:
                _active_claim.reset(claim_token)
        return await _recorded(self._on_portal(self._succeed) if memory else self._succeed, claim, value), False

    def _on_portal(
        self, step: Callable[[_Claim, Any], Coroutine[Any, Any, T]]
    ) -> Callable[[_Claim, Any], Awaitable[T]]:
        """A recording step run on the portal's loop, where an in-memory store lives."""
        return lambda claim, arg: self._portal.arun(step(claim, arg))

    def _drive_sync(self, call: _Call, body: Callable[[str], T]) -> tuple[T, bool]:
        portal = self._portal
        outcome: _Claim | _Replay | None = self._cached(call)
        if outcome is None:
            outcome = portal.run(self._begin(call))
        if isinstance(outcome, _Replay):
            return outcome.result(), True
        token = _key.set(call.key)
        try:
            value = body(call.key)
        except BaseException as exc:
            portal.run(self._fail(outcome, exc))
            raise
        finally:
            _key.reset(token)
        return portal.run(self._succeed(outcome, value)), False

    # -- building calls -------------------------------------------------------------------------------

    def _codec_for(self, annotation: Any) -> Codec:
        try:
            codec = self._codecs.get(annotation)
        except TypeError:  # unhashable annotation
            return Codec(annotation)
        if codec is None:
            codec = self._codecs[annotation] = Codec(annotation)
        return codec

    def _make_call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        key_values: Mapping[str, Any] | str | None,
        task_id: str | None,
        scope: str | None,
        codec: Codec,
        cache_errors: tuple[type[BaseException], ...],
        on_conflict: str | None,
        wait_timeout: float | None,
        audit: str | None = None,
    ) -> _Call:
        if scope is not None:
            scope = check_id(scope, "scope", MAX_SCOPE)
        if task_id is None:
            info = current_task()
            if info is None:
                raise _no_task(tool)
            task_id, scope = info.task_id, scope or info.scope
        else:
            task_id = check_task_id(task_id, source="task_id=", tool=tool)
        scope = scope or DEFAULT_SCOPE
        if type(key_values) is str:  # (a key callable's result, or run(key="...")): stored in the operation
            key_values = check_id(key_values, f"the key of {tool!r}", MAX_TASK_ID)
        fp = fingerprint(arguments)
        operation = operation_name(tool, key_values)
        # (positional: this is on every call's path)
        return _Call(
            scope, task_id, operation, derive_key(scope, task_id, operation), arguments, fp, codec, cache_errors,
            on_conflict or self._on_conflict, self._wait_timeout if wait_timeout is None else wait_timeout, tool,
            audit,
        )

    def _flat_call(
        self, flat: FlatSignature, values: list[str], arguments: Mapping[str, Any], codec: Codec,
        cache_errors: tuple[type[BaseException], ...],
    ) -> _Call:
        """``_make_call`` for a decorated tool whose arguments are all flat (str/int/bool/None), in the task
        context: the same identity from one pass over the arguments' canonical JSON."""
        info = current_task()
        if info is None:
            raise _no_task(flat.tool)
        scope, task_id = info.scope, info.task_id
        operation, key, fp = flat.identity(scope, task_id, values)
        return _Call(
            scope, task_id, operation, key, arguments, fp, codec, cache_errors, self._on_conflict,
            self._wait_timeout, flat.tool, None, None, None, None, (flat, values),
        )

    # -- public entry points --------------------------------------------------------------------------

    def _run_call(
        self, operation: str, arguments: Mapping[str, Any] | None, key: Mapping[str, Any] | str | None,
        task_id: str | None, scope: str | None, returns: Any, cache_errors: tuple[type[BaseException], ...],
        on_conflict: str | None, wait_timeout: float | None, audit: Mapping[str, Any] | None,
    ) -> _Call:
        _check_operation(operation)
        return self._make_call(
            operation, arguments or {}, key, task_id=task_id, scope=scope, codec=self._codec_for(returns),
            cache_errors=_check_errors(cache_errors), on_conflict=on_conflict, wait_timeout=wait_timeout,
            audit=None if audit is None else _codec.dumps(dict(audit)),
        )

    async def run(
        self,
        operation: str,
        body: Callable[[str], Awaitable[T]],
        *,
        arguments: Mapping[str, Any] | None = None,
        key: Mapping[str, Any] | str | None = None,
        task_id: str | None = None,
        scope: str | None = None,
        returns: Any = Any,
        cache_errors: tuple[type[BaseException], ...] = (),
        on_conflict: Literal["wait", "raise"] | None = None,
        wait_timeout: float | None = None,
        audit: Mapping[str, Any] | None = None,
    ) -> Outcome[T]:
        """Guard one call without a decorator (for adapters and proxies).

        ``body`` receives the downstream key. ``arguments`` are fingerprinted; ``key`` holds the values
        that tell operations apart within a task. ``audit`` is stored beside the record, never in the key.
        """
        call = self._run_call(operation, arguments, key, task_id, scope, returns, cache_errors, on_conflict,
                              wait_timeout, audit)
        value, replayed = await self._drive(call, body)
        return Outcome(value, replayed, call.key, call.operation, call.task_id, call.scope)

    def run_sync(
        self,
        operation: str,
        body: Callable[[str], T],
        *,
        arguments: Mapping[str, Any] | None = None,
        key: Mapping[str, Any] | str | None = None,
        task_id: str | None = None,
        scope: str | None = None,
        returns: Any = Any,
        cache_errors: tuple[type[BaseException], ...] = (),
        on_conflict: Literal["wait", "raise"] | None = None,
        wait_timeout: float | None = None,
        audit: Mapping[str, Any] | None = None,
    ) -> Outcome[T]:
        """:meth:`run` for sync code: ``body`` runs in this thread; store calls go to the guard's portal."""
        call = self._run_call(operation, arguments, key, task_id, scope, returns, cache_errors, on_conflict,
                              wait_timeout, audit)
        value, replayed = self._drive_sync(call, body)
        return Outcome(value, replayed, call.key, call.operation, call.task_id, call.scope)

    @overload
    def once(self, fn: Callable[P, R], /) -> Callable[P, R]: ...

    @overload
    def once(
        self,
        fn: None = None,
        /,
        *,
        operation: str | None = None,
        key: Sequence[str] | str | Callable[[Mapping[str, Any]], str] | None = None,
        ignore: Sequence[str] = (),
        cache_errors: tuple[type[BaseException], ...] = (),
        inject: str | None = "idempotency_key",
        on_unknown: Literal["retry", "reconcile", "hold"] = "hold",
        reconcile: Reconcile | None = None,
        resumable: bool = False,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def once(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        operation: str | None = None,
        key: Sequence[str] | str | Callable[[Mapping[str, Any]], str] | None = None,
        ignore: Sequence[str] = (),
        cache_errors: tuple[type[BaseException], ...] = (),
        inject: str | None = "idempotency_key",
        on_unknown: Literal["retry", "reconcile", "hold"] = "hold",
        reconcile: Reconcile | None = None,
        resumable: bool = False,
    ) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
        """Run the decorated tool at most once per (scope, task, operation); replay its outcome after.

        ``key``: argument names whose values tell operations apart within a task (none: one operation
        per task), or a callable of the bound arguments returning a string. ``ignore``: arguments left
        out of the fingerprint. ``cache_errors``: exception classes stored and replayed like results.
        ``inject``: a parameter that receives the downstream key, hidden from the wrapper's signature.
        Multi-step tools (a parameter annotated ``Operation``): ``on_unknown`` says what a takeover does
        with a step whose worker died inside it — ``"retry"`` it with the same sub-key, ``"reconcile"``
        it through ``reconcile(op, step, sub_key)`` (the provider's result, or None for "did not
        happen"), or ``"hold"`` it with ``OutcomeUnknownError`` until ``agentguard resolve``.
        ``resumable``: store the arguments so ``complete_stalled()`` can finish abandoned operations.
        """
        if operation is not None:
            _check_operation(operation)
        if on_unknown not in ("retry", "reconcile", "hold"):
            raise ValueError(f"on_unknown must be 'retry', 'reconcile' or 'hold', got {on_unknown!r}")
        if (on_unknown == "reconcile") != (reconcile is not None):
            raise TypeError("on_unknown='reconcile' needs reconcile=<async fn(op, step, sub_key)>, and only it")
        errors = _check_errors(cache_errors)

        def decorate(f: Callable[P, R]) -> Callable[P, R]:
            spec = _Spec(self, f, operation=operation, key=key, ignore=ignore, cache_errors=errors, inject=inject,
                         on_unknown=on_unknown, reconcile=reconcile, resumable=resumable)
            wrapped: Callable[P, R] = spec.wrapper()
            if resumable:
                self._resumable[spec.tool] = wrapped
            return wrapped

        return decorate if fn is None else decorate(fn)

    # -- multi-step operations: stalled and held ones ----------------------------------------------------

    async def complete_stalled(self, *, limit: int = 100) -> list[Outcome[Any]]:
        """Push operations whose callers went away (lease expired or released, tool ``resumable=True``)
        through their remaining steps, with their stored arguments. Returns what each produced."""
        rows = await self._store_call(self._store.stalled(limit=limit))
        done: list[Outcome[Any]] = []
        for scope, key, task_id, tool, arguments in rows:
            fn = self._resumable.get(tool)
            if fn is None:
                log.info("stalled operation %s (tool %s) has no resumable tool on this guard", key, tool)
                continue
            spec: _Spec = fn.__agentguard__  # type: ignore[attr-defined]
            kwargs = spec.decode_arguments(arguments)
            with _task_ctx(task_id, scope=scope):
                call, _ = spec.call((), kwargs)
                value, replayed = await self._drive(
                    call, functools.partial(spec.invoke, (), kwargs, kwargs), multi_step=spec.op_param is not None
                )
            done.append(Outcome(value, replayed, call.key, call.operation, call.task_id, call.scope))
        return done

    async def unknown(self, *, scope: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Operations with a step whose outcome is unknown (its worker died inside it), for a person."""
        rows = await self._store_call(self._store.unknown(scope=scope, limit=limit))
        names = ("scope", "key", "task_id", "operation", "step", "attempts", "age")
        return [dict(zip(names, r, strict=True)) for r in rows]

    async def resolve(
        self, key: str, *, scope: str = "default", result: Any = _UNSET, retry: bool = False, abandon: bool = False
    ) -> str:
        """Settle a held operation: record its unknown step's ``result``, or ``retry`` the step on the next
        attempt, or ``abandon`` the operation (every later call raises ``OutcomeUnknownError``)."""
        if sum((result is not _UNSET, retry, abandon)) != 1:
            raise ValueError("give exactly one of result=..., retry=True or abandon=True")
        held = [u for u in await self.unknown(scope=scope, limit=1000) if u["key"] == key]
        if abandon:
            err = OutcomeUnknownError(f"operation {key} was abandoned by an operator after an unknown outcome")
            if not await self._store_call(self._store.abandon(scope, key, _codec.encode_error(err), self._retention)):
                raise GuardError(f"no released or stalled operation {key!r} in scope {scope!r} to abandon", key=key)
            self._cache.clear()
            return "abandoned"
        if not held:
            raise GuardError(f"no operation {key!r} in scope {scope!r} has a step with an unknown outcome", key=key)
        step = held[0]["step"]
        if retry:
            ok = await self._store_call(self._store.resolve_step(scope, key, step, None, None))
        else:
            ok = await self._store_call(self._store.resolve_step(scope, key, step, "done", _codec.dumps(result)))
        if not ok:
            raise GuardError(f"the unknown step {step!r} of {key!r} changed meanwhile; look again", key=key)
        return f"step {step!r} " + ("cleared for a retry" if retry else "recorded as done")


def _no_task(tool: str) -> MissingTaskError:
    return MissingTaskError(
        f"no task id for {tool!r}: call it inside `with agentguard.task(<task id>):` (or give the adapter a "
        "task_id); the tool was not run",
        operation=tool,
    )


def _check_operation(operation: object) -> str:
    """An operation (tool) name: a str (TypeError otherwise) that follows the id rule (ValueError)."""
    if not isinstance(operation, str):
        raise TypeError(f"operation must be a string naming the operation, got {type(operation).__name__} "
                        f"{operation!r}")
    return check_id(operation, "operation", MAX_OPERATION)


def _check_errors(cache_errors: Any) -> tuple[type[BaseException], ...]:
    if isinstance(cache_errors, type):
        cache_errors = (cache_errors,)
    if not isinstance(cache_errors, tuple | list) or not all(
        isinstance(c, type) and issubclass(c, Exception) for c in cache_errors
    ):
        raise TypeError(f"cache_errors must be a tuple of Exception classes, got {cache_errors!r}")
    return tuple(cache_errors)


def _reject_framework_tool(fn: Any) -> None:
    if inspect.isfunction(fn) or inspect.ismethod(fn) or isinstance(fn, functools.partial):
        return
    tool = made_by(fn)
    if tool is not None:
        made, framework = tool
        top = made if made.startswith("@") else "@agent.tool"
        raise TypeError(
            f"@guard.once was placed on top of a {type(fn).__name__} made by {framework}'s {made}; put it "
            "underneath instead, directly on the function:\n"
            f"    {top:<20}# the framework's decorator on top\n"
            f"    {'@guard.once(...)':<20}# agentguard right above the function\n"
            "    def charge(...): ..."
        )
    if not callable(fn):
        raise TypeError(f"@guard.once needs a function, got {type(fn).__name__}")


class _Spec:
    """Everything the decorator decides once, at decoration time."""

    def __init__(
        self,
        guard: Guard,
        fn: Callable[..., Any],
        *,
        operation: str | None,
        key: Sequence[str] | str | Callable[[Mapping[str, Any]], str] | None,
        ignore: Sequence[str],
        cache_errors: tuple[type[BaseException], ...],
        inject: str | None,
        on_unknown: str = "hold",
        reconcile: Reconcile | None = None,
        resumable: bool = False,
    ) -> None:
        _reject_framework_tool(fn)
        self.guard, self.fn = guard, fn
        self.tool = _check_operation(operation or getattr(fn, "__name__", None) or type(fn).__name__)
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        self.on_unknown, self.reconcile = on_unknown, reconcile
        self.full_sig = sig = inspect.signature(fn)
        params = sig.parameters
        if inject is not None and inject not in params and inject != "idempotency_key":
            raise TypeError(f"{self.tool}: inject={inject!r} names no parameter of the function")
        self.inject = inject if inject in params else None
        try:
            hints = typing.get_type_hints(fn)
        except NameError:
            hints = {}  # a forward reference not resolvable yet: replay untyped (tagged JSON)
        except Exception as exc:
            raise TypeError(f"{self.tool}: cannot read the type hints: {exc}") from None
        ops = [n for n in params if hints.get(n) is Operation]
        self.op_param = ops[0] if ops else None
        if len(ops) > 1:
            raise TypeError(f"{self.tool}: only one parameter may be annotated Operation")
        if self.op_param and not self.is_async:
            raise TypeError(f"{self.tool}: a multi-step tool (with an Operation parameter) must be async")
        hidden = {self.inject, self.op_param}
        self.public_sig = sig.replace(parameters=[p for n, p in params.items() if n not in hidden])
        # A fast binder for the common signature (named parameters only); anything else, and every
        # mistake, goes through Signature.bind for its exact TypeError.
        kinds = [p.kind for p in self.public_sig.parameters.values()]
        self.simple = all(k in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                          for k in kinds)
        self.pos_names = tuple(n for n, p in self.public_sig.parameters.items()
                               if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.all_names = tuple(self.public_sig.parameters)
        # (-1: never; some parameter is keyword-only, *args or **kwargs)
        self.n_positional = len(self.pos_names) if self.simple and len(self.pos_names) == len(self.all_names) else -1
        self.name_set = frozenset(self.all_names)
        self.defaults = {n: p.default for n, p in self.public_sig.parameters.items()
                         if p.default is not inspect.Parameter.empty}
        names = set(self.public_sig.parameters)
        if isinstance(ignore, str):
            ignore = (ignore,)
        for n in ignore:
            if n not in names:
                raise TypeError(f"{self.tool}: ignore names {n!r}, which is not a parameter")
        self.excluded = set(ignore)
        first = next(iter(params), None)
        if first in ("self", "cls"):
            self.excluded.add(first)  # the bound instance is not an argument of the operation
            if resumable:
                raise TypeError(f"{self.tool}: a method cannot be resumable (its instance is not stored)")
        self.key_fn: Callable[[Mapping[str, Any]], str] | None = None
        self.key_fields: tuple[str, ...] = ()
        if callable(key):
            self.key_fn = key
        elif key is not None:
            self.key_fields = (key,) if isinstance(key, str) else tuple(key)
            for n in self.key_fields:
                if n not in names:
                    raise TypeError(f"{self.tool}: key names {n!r}, which is not a parameter")
        # The one-pass identity of the common call (every argument str/int/bool/None); not for key callables
        # or key fields left out of the fingerprint, which take the general path.
        fp_names = [n for n in self.all_names if n not in self.excluded]
        self.flat: FlatSignature | None = None
        if self.simple and self.key_fn is None and set(self.key_fields) <= set(fp_names):
            self.flat = FlatSignature(self.tool, fp_names, self.key_fields)
        self.codec = guard._codec_for(hints.get("return", Any))
        self.cache_errors = cache_errors
        # Codecs of the arguments, to store and rebuild them for complete_stalled().
        self.arg_codecs: dict[str, Codec] | None = None
        if resumable:
            self.arg_codecs = {n: guard._codec_for(hints.get(n, Any)) for n in names}
        # The downstream key can be passed by keyword iff no positional argument can reach its slot.
        inj = params.get(self.inject) if self.inject else None
        after = list(params)[list(params).index(self.inject) + 1:] if self.inject else []
        self.fast_inject = self.op_param is None and inj is not None and inj.kind != inj.POSITIONAL_ONLY and all(
            params[n].kind in (inj.KEYWORD_ONLY, inj.VAR_KEYWORD) for n in after
        )

    def encode_arguments(self, arguments: Mapping[str, Any]) -> str | None:
        if self.arg_codecs is None:
            return None
        try:
            return json.dumps({n: self.arg_codecs[n].encode(v) for n, v in arguments.items()})
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{self.tool} is resumable but its arguments cannot be stored: {exc}") from None

    def decode_arguments(self, text: str) -> dict[str, Any]:
        assert self.arg_codecs is not None
        return {n: self.arg_codecs[n].decode(v) for n, v in json.loads(text).items()}

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if not kwargs and len(args) == self.n_positional:  # every parameter passed by position
            return dict(zip(self.pos_names, args))  # noqa: B905 - equal lengths, just checked (strict= costs)
        if self.simple and len(args) <= len(self.pos_names):
            arguments = dict(zip(self.pos_names, args, strict=False))
            ok = True
            for k, v in kwargs.items():
                if k in arguments or k not in self.name_set:
                    ok = False
                    break
                arguments[k] = v
            if ok and len(arguments) < len(self.all_names):
                for n in self.all_names:
                    if n not in arguments:
                        if n not in self.defaults:
                            ok = False
                            break
                        arguments[n] = self.defaults[n]
            if ok:
                return arguments
        bound = self.public_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Call, Mapping[str, Any]]:
        arguments = self.bind(args, kwargs)
        excluded = self.excluded
        fp_args = {k: v for k, v in arguments.items() if k not in excluded} if excluded else arguments
        flat = self.flat
        values = None if flat is None else flat.values(fp_args)
        if values is not None:
            assert flat is not None
            call = self.guard._flat_call(flat, values, fp_args, self.codec, self.cache_errors)
        else:
            if self.key_fn is not None:
                key_values: Mapping[str, Any] | str | None = self.key_fn(dict(arguments))
                if not isinstance(key_values, str):
                    raise TypeError(
                        f"{self.tool}: the key callable must return a str, got {type(key_values).__name__}"
                    )
            else:
                key_values = {n: arguments[n] for n in self.key_fields} if self.key_fields else None
            call = self.guard._make_call(self.tool, fp_args, key_values, None, None, self.codec, self.cache_errors,
                                         None, None)
        if self.arg_codecs is not None:
            call.arguments = self.encode_arguments(arguments)
        return call, arguments

    def invoke(self, args: tuple[Any, ...], kwargs: dict[str, Any], arguments: Mapping[str, Any], key: str) -> Any:
        inject, op_param = self.inject, self.op_param
        if inject is None and op_param is None:
            return self.fn(*args, **kwargs)
        if self.fast_inject:
            assert inject is not None
            return self.fn(*args, **kwargs, **{inject: key})
        full = dict(arguments)
        if inject is not None:
            full[inject] = key
        if op_param is not None:
            claim = _active_claim.get()
            assert claim is not None
            full[op_param] = Operation(self.guard, claim, self.on_unknown, self.reconcile)
        ordered = {n: full[n] for n in self.full_sig.parameters}
        ba = inspect.BoundArguments(self.full_sig, ordered)  # type: ignore[arg-type,unused-ignore]
        return self.fn(*ba.args, **ba.kwargs)

    def wrapper(self) -> Any:
        fn, guard, spec = self.fn, self.guard, self
        multi_step = self.op_param is not None

        if self.is_async:

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                call, arguments = spec.call(args, kwargs)
                value, _ = await guard._drive(call, lambda key: spec.invoke(args, kwargs, arguments, key),
                                              multi_step=multi_step)
                return value

            wrapper: Any = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                call, arguments = spec.call(args, kwargs)
                value, _ = guard._drive_sync(call, lambda key: spec.invoke(args, kwargs, arguments, key))
                return value

            wrapper = sync_wrapper
        functools.update_wrapper(wrapper, fn)
        wrapper.__signature__ = self.public_sig
        # functools.wraps shares fn's annotations dict: copy it, never mutate it.
        annotations = dict(getattr(fn, "__annotations__", {}))
        for hidden in (self.inject, self.op_param):
            annotations.pop(hidden or "", None)
        wrapper.__annotations__ = annotations
        wrapper.__agentguard__ = self
        return wrapper
