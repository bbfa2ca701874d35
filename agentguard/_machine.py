"""The state machine of one guarded call, written once: derive -> claim -> replay | conflict | run -> record |
release.

Sans I/O. ``begin`` decides (replay a stored outcome, refuse, wait for a caller in flight, or claim the key and
run); ``succeed`` and ``fail`` record what the body did. Each is a *plan*: a generator that hands out what it
needs done — a statement of the store, a wait for news of a key, the heartbeat started or stopped, a pause (the
requests below) — and takes each answer (or the store's ``StoreError``, thrown in). Drivers run plans
(``agentguard._drive``): the async one awaits each request on the caller's loop; the sync one answers them in
the caller's thread where the store can (``SQLStore.direct``) and sends any it cannot serve there, alone and as
it is, to the guard's portal loop. No decision is made anywhere else, and no plan does I/O of its own.

The rules each line keeps (see docs/architecture.md): claim by insert, never check-then-insert; tolerate the
winner's row vanishing; fence every write after the claim; never clean up inside a failed transaction; retry a
write after the body through a short outage rather than let a takeover run the body again; run a body again
after its worker went away only where the key reaches the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from . import _codec
from ._cache import ReplayCache
from ._calls import Call, Claim, Replay
from ._errors import (
    GuardError,
    InProgressError,
    KeyReuseError,
    LeaseLostError,
    NotStarted,
    OutcomeUnknownError,
    ResultNotStoredError,
    StoreError,
)
from ._events import Events
from ._fork import on_fork
from ._lease import Heartbeats, PendingBeats, new_fence, new_owner
from ._observe import Observer
from ._portal import Portal
from ._storeconfig import resolve_command
from ._watch import Watcher, Watches
from .stores import FAILED, RELEASED, RUNNING, SUCCEEDED, Record, Store, record_of
from .stores._attempts import LEASE_LOST, RAN, RELEASED_KIND
from .stores._protocols import Direct
from .stores._schema import NOT_STORED_PREFIX, UNBOUND

log = logging.getLogger("agentguard")
T = TypeVar("T")

REPLAYING_MAX = 4096  # tasks remembered as replaying (see Replaying)
MAX_VANISHED = 5  # bounded retries when the winner's row vanishes between our failed insert and read
POLL_MAX = 0.1  # seconds between a waiting key's reads of the store, at most (one reader per key and process)
POLL_LISTENING = 1.0  # the same, while the store announces the key's outcome to this process (a fallback)
TAKEN_LIKELY = 0.5  # claims lately that found their key taken, as a share, past which a new task's claim reads first
TAKEN_WEIGHT = 1 / 8  # the weight of the latest claim in that share (after a change of work, 6 claims cross it)


# -- what a plan asks for --------------------------------------------------------------------------------------
# Each request names one thing to do and what its answer is. A store's statement answers what the store's verb
# of the same name answers (``stores._protocols.ClaimStore``), or raises StoreError into the plan.


class Request:
    __slots__ = ()


class ClaimKey(Request):
    """Claim the key (``params``: ``Machine.claim_params``): our fence, the record there, or None (it vanished).
    ``likely_taken``: the key is likely held or done already (the store then reads before it inserts)."""

    __slots__ = ("likely_taken", "params")

    def __init__(self, params: dict[str, Any], likely_taken: bool) -> None:
        self.params, self.likely_taken = params, likely_taken


class TakeOver(Request):
    """Take over a record no longer live, seen under ``params["fence"]``: (fence, origin), or None."""

    __slots__ = ("params",)

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params


class ReleaseOwned(Request):
    """Release the claim a cancelled claimer may or may not have made, by its owner token: bool."""

    __slots__ = ("key", "owner", "retention", "scope")

    def __init__(self, scope: str, key: str, owner: str, retention: float) -> None:
        self.scope, self.key, self.owner, self.retention = scope, key, owner, retention


class Hold(Request):
    """Mark a running record whose worker went away held for a person, under the fence seen: bool."""

    __slots__ = ("fence", "key", "scope")

    def __init__(self, scope: str, key: str, fence: int) -> None:
        self.scope, self.key, self.fence = scope, key, fence


class Complete(Request):
    """Record the outcome under our fence: bool (False: the claim is no longer ours)."""

    __slots__ = ("audit", "fence", "key", "result", "retention", "scope", "state")

    def __init__(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                 audit: str | None) -> None:
        self.scope, self.key, self.fence, self.state, self.result = scope, key, fence, state, result
        self.retention, self.audit = retention, audit


class Release(Request):
    """Release our claim (the body raised ``raised``; ``bound``: it started, so it keeps binding): bool."""

    __slots__ = ("audit", "bound", "fence", "key", "raised", "retention", "scope")

    def __init__(self, scope: str, key: str, fence: int, retention: float, audit: str | None, raised: str,
                 bound: bool) -> None:
        self.scope, self.key, self.fence, self.retention, self.audit = scope, key, fence, retention, audit
        self.raised, self.bound = raised, bound


class Run(Request):
    """Any other write of the store, made by ``fn`` (a step's result): its answer."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Awaitable[Any]]) -> None:
        self.fn = fn


class AwaitNews(Request):
    """Wait (one round) for news of a key another caller holds: until its outcome is announced or recorded
    here, or for the poller's next look, never past ``waiting.deadline``. Answers None."""

    __slots__ = ("call", "waiting")

    def __init__(self, call: Call, waiting: Waiting) -> None:
        self.call, self.waiting = call, waiting


class StartBeat(Request):
    """Renew the claim's lease while its body runs."""

    __slots__ = ("claim",)

    def __init__(self, claim: Claim) -> None:
        self.claim = claim


class StopBeat(StartBeat):
    """Stop renewing it (the body ended), once a renewal in flight has ended."""

    __slots__ = ()


class ResumeBeat(StartBeat):
    """Renew it again, while a write after its body is retried through an outage."""

    __slots__ = ()


class Pause(Request):
    """Sleep ``seconds`` (between the attempts of a write through an outage)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Plan = Generator[Request, Any, T]


class Waiting:
    """A call waiting for another caller of its key: until when, how long it waits between looks, and its place
    among this process's waiters on the key (``_watch``), joined at its first wait."""

    __slots__ = ("began", "deadline", "delay", "watcher")

    def __init__(self, wait_timeout: float | None, now: float) -> None:
        self.began = now
        self.deadline = now + wait_timeout if wait_timeout is not None else float("inf")
        self.delay = 0.01
        self.watcher: Watcher | None = None


def claim_retention(retention: float, lease: float) -> float:
    """The retention a claim (and a takeover) writes: the guard's, and a margin of the lease, at most a hundredth of
    the retention. The completion moves the expiry only where it is earlier than its own retention from then
    (``_statements.COMPLETED``), so a body that ends within the margin completes without changing it: on Postgres
    that completion changes no indexed column, a HOT update that writes no index entry. A record is kept at least
    its retention after its outcome, and at most the margin longer."""
    return retention + min(lease, retention / 100)


class Replaying:
    """Whether a call's key is likely taken already, so that its claim is asked the way that then costs least —
    the store reads before it inserts. Kept only where a read costs less than a claim that finds its key
    (Postgres); advisory (a wrong guess costs one statement: the insert decides either way), bounded.

    - By task: a task whose last call here was a replay from the store (a resumed agent going over its history):
      its next call is likely a replay too.
    - By process: the first call of a task this process has not seen, while most claims here lately found their
      key taken (``rate``, a moving average over this process's claims: a worker restarted after a crash, resuming
      agent after agent, each first call a replay). Past ``TAKEN_LIKELY`` a read first costs less on average:
      on Postgres a read is about half of what an insert that finds its key costs, and a first call it misses
      pays the read on top of its insert (``docs/benchmarks.md``). A worker gone back to new work has the rate
      fall below it again within a few claims."""

    def __init__(self, kept: bool) -> None:
        self.kept = kept
        self._tasks: dict[tuple[str, str], None] = {}
        self.rate = 0.0  # of this process's claims lately, the share that found their key taken

    def __contains__(self, call: Call) -> bool:
        return self.kept and ((call.scope, call.task_id) in self._tasks or self.rate > TAKEN_LIKELY)

    def found(self, taken: bool) -> None:
        """A claim's first statement found the key taken (a record there), or claimed it."""
        if self.kept:  # (threads may race here: an update lost costs one guess)
            self.rate += ((1.0 if taken else 0.0) - self.rate) * TAKEN_WEIGHT

    def add(self, call: Call) -> None:
        if self.kept:
            if len(self._tasks) >= REPLAYING_MAX:
                self._tasks.clear()
            self._tasks[(call.scope, call.task_id)] = None

    def discard(self, call: Call) -> None:
        """The task's call was not a replay after all."""
        self._tasks.pop((call.scope, call.task_id), None)


class Machine:
    """The state machine, bound to one store and one guard's settings; the plans of a call."""

    def __init__(
        self, store: Store, portal: Portal, *, lease: float, retention: float, window: float, events: Events,
        cache: ReplayCache, observer: Observer | None = None,
    ) -> None:
        self.store = store
        self.observer = Observer(None) if observer is None else observer
        self.portal = portal
        self.lease = lease
        self.retention = retention
        self.claim_retention = claim_retention(retention, lease)
        self.window = window
        self.events = events
        self.cache = cache
        self.beats = Heartbeats(lease, self.renew)
        self.pending = PendingBeats(self.beats, portal.loop)  # claims made in sync tools' threads, not yet on a beat
        self.watches = Watches()  # callers of this process waiting for a key held by another caller
        # The store announces outcomes to waiting processes (Postgres); a stand-in store may not.
        self.announced = bool(getattr(store, "announces", False)) and callable(getattr(store, "watch", None))
        self.replaying = Replaying(store.read_is_cheaper)
        on_fork(self)

    def after_fork(self) -> None:
        """In a forked child: no claim of the parent's is renewed here and none of its callers waits here; this
        process's claims get heartbeats of their own, on its own loops (``_fork``)."""
        self.beats = Heartbeats(self.lease, self.renew)
        self.watches = Watches()
        self.pending = PendingBeats(self.beats, self.portal.loop)
        self.cache.after_fork()

    def direct(self) -> Direct | None:
        """The store's statements in a sync tool's own thread, where it has them (``SQLStore.direct``)."""
        direct = getattr(self.store, "direct", None)
        return None if direct is None else direct()

    async def store_call(self, coro: Awaitable[T]) -> T:
        """A store verb run where the store lives: an in-memory SQLite database is one connection, on the
        portal's loop."""
        return await (self.portal.arun(coro) if self.store.memory else coro)  # type: ignore[arg-type]

    async def renew(self, claim: Claim) -> None:
        # A lease is not a lock: renew it while the body runs; every write stays fenced anyway.
        call = claim.call
        try:
            if not await self.store.renew(call.scope, call.key, claim.fence, self.lease):
                self.events.emit("lease_lost", call, claim.attempt, "renewal found the claim taken over")
        except GuardError as exc:
            claim.renewed = float("-inf")  # due again at the next tick, not a third of a lease later
            log.warning("could not renew the lease of %s: %s", call.operation, exc)

    # -- begin: replay | refuse | wait | claim ---------------------------------------------------------------

    def cached(self, call: Call) -> Replay | None:
        """A replay served from the in-process cache: no round trip (raises on a fingerprint mismatch)."""
        rec = self.cache.get(call.scope, call.key)
        if rec is None:
            return None
        if rec.fingerprint != call.fingerprint:
            raise self.reuse_error(call, rec)
        self.events.emit("replayed", call, rec.attempts, "from the in-process cache")
        return Replay(call, rec, "cache")

    def claim_params(self, call: Call, owner: str) -> dict[str, Any]:
        return {
            "scope": call.scope, "key": call.key, "task_id": call.task_id, "operation": call.operation,
            "fingerprint": call.fingerprint, "arg_hashes": call.arg_hashes_json, "owner": owner,
            "lease": self.lease, "retention": self.claim_retention, "audit": call.audit, "tool": call.tool,
            "arguments": call.arguments, "fence": new_fence(),
        }

    def begin(self, call: Call) -> Plan[Claim | Replay]:
        """Claim the key and run (a Claim), replay a stored outcome (a Replay), or refuse (raise)."""
        # The key is likely taken when the task's previous call here was a replay (a resumed agent going over
        # its history: the store then reads before it inserts), when most claims here lately found theirs taken
        # (a new task's first call, in a worker resuming agent after agent), and once a claim here found it taken.
        taken = call in self.replaying
        owner = new_owner()
        params = self.claim_params(call, owner)
        waiting: Waiting | None = None
        vanished, first = 0, True
        try:
            while True:
                # Claim by insert, never check-then-insert: one statement decides.
                try:
                    got = yield ClaimKey(params, taken)
                except asyncio.CancelledError:
                    yield from self._undo_claim(call, owner)
                    raise
                if first:  # (what the call's first claim found, for the next new task's: see Replaying)
                    self.replaying.found(not isinstance(got, int))
                    first = False
                if isinstance(got, int):
                    self.events.emit("claimed", call, 1)
                    return (yield from self.claimed(call, got, 1, got))
                rec, taken = got, True
                if rec is None:
                    # The winner's row vanished (swept) between our insert and our read: claim again.
                    vanished += 1
                    if vanished >= MAX_VANISHED:
                        raise call.error(InProgressError, f"the record of {call.operation!r} kept vanishing while "
                                                          "being claimed; the tool was not run. Retry the same call "
                                                          "shortly.")
                    continue
                if rec.owner == owner and rec.state == RUNNING:
                    # Our own insert committed but its reply was lost (a reconnect, or a statement made in the
                    # caller's thread that failed after its commit and went again on the portal).
                    self.events.emit("claimed", call, rec.attempts)
                    return (yield from self.claimed(call, rec.fence, rec.attempts, rec.origin))
                if (replay := self.answered(call, rec)) is not None:
                    return replay
                stale = rec.expired and not rec.live  # past retention: a new operation
                if not stale and not rec.live and rec.state == RUNNING and call.on_unknown == "hold":
                    # Its worker went away inside the body, and the key cannot reach the provider: a second run
                    # could not be deduplicated there, so it is held for a person.
                    raise (yield from self._held_body(call, rec))
                if stale or not rec.live:
                    try:
                        took = yield TakeOver({**params, "fence": rec.fence, "reset": 1 if stale else 0})
                    except asyncio.CancelledError:
                        yield from self._undo_claim(call, owner)
                        raise
                    if took is not None:
                        attempt = 1 if stale else rec.attempts + 1
                        self.events.emit("takeover" if not stale else "claimed", call, attempt,
                                         f"previous state {rec.state}" if not stale else "previous record expired")
                        gone = (rec.attempts, rec.owner) if rec.state == RUNNING else None
                        return (yield from self.claimed(call, took[0], attempt, took[1], None if stale else rec.state,
                                                        gone))
                    continue  # another caller took it first: look again
                if call.on_conflict == "raise":
                    raise self.in_progress(call, rec, "on_conflict='raise'")
                now = time.monotonic()
                if waiting is None:
                    waiting = Waiting(call.wait_timeout, now)
                    self.events.emit("waiting", call, rec.attempts)
                if now >= waiting.deadline:
                    raise self.in_progress(call, rec, f"waited {call.wait_timeout:g}s for it to finish")
                yield AwaitNews(call, waiting)
                if (replay := self.cached(call)) is not None:  # recorded here meanwhile: no round trip
                    return replay
        finally:
            if waiting is not None:  # from the first sight of the holder to the answer: every wait and look
                call.waited += time.monotonic() - waiting.began
                if waiting.watcher is not None:
                    waiting.watcher.leave()

    def claimed(self, call: Call, fence: int, attempt: int, origin: int, took: str | None = None,
                gone: tuple[int, str | None] | None = None) -> Plan[Claim]:
        self.replaying.discard(call)  # (the body runs: the task's call was not a replay after all)
        claim = Claim(call, fence, attempt, origin, took, gone)
        yield StartBeat(claim)
        return claim

    def _undo_claim(self, call: Call, owner: str) -> Plan[None]:
        """We were cancelled while claiming: if the claim committed, it is ours (owner token) — release it
        (binding nothing: the body never started) rather than leave it held until the lease runs out."""
        with contextlib.suppress(Exception):  # (the cancellation is what the caller hears)
            yield ReleaseOwned(call.scope, call.key, owner, self.retention)

    def answered(self, call: Call, rec: Record) -> Replay | None:
        """A record the claim found: its replay if it is a completed one within retention, None if it does not
        answer the call (running, released, past retention); raises if it was made with other arguments."""
        if rec.expired and not rec.live:  # past retention: a new operation
            return None
        if rec.fingerprint != call.fingerprint and rec.fingerprint != UNBOUND:  # (unbound: its body never started)
            raise self.reuse_error(call, rec)
        return self.replayed(call, rec) if rec.state in (SUCCEEDED, FAILED) else None

    def replayed(self, call: Call, rec: Record) -> Replay:
        """A terminal record with our fingerprint, read from the store: replay it (and remember the task)."""
        self.events.emit("replayed", call, rec.attempts)
        if not held(rec):  # (a held outcome a person may settle meanwhile is read from the store each time)
            self.cache.put(rec, time.monotonic() - 1.0 + rec.ttl)  # margin: the read's round trip
        self.watches.news((call.scope, call.key))  # this process's other waiters on the key: look again
        self.replaying.add(call)
        return Replay(call, rec)

    def _held_body(self, call: Call, rec: Record) -> Plan[OutcomeUnknownError]:
        """A record whose worker went away inside the body, for a call whose key cannot reach the provider:
        marked held for a person (``agentguard ls --unknown``; its worker, if only stalled, may still record its
        outcome), and the error to raise."""
        self.events.emit("held", call, rec.attempts, "its worker went away inside the body")
        try:
            yield Hold(call.scope, call.key, rec.fence)
        except StoreError as exc:  # (only what a person sees: the refusal stands either way)
            log.warning("could not mark %s held for a person: %s", call.operation, exc)
        command = resolve_command(getattr(self.store, "url", ""), call.key, call.scope)
        return call.error(  # type: ignore[no-any-return]
            OutcomeUnknownError, f"{call.operation!r} in task {call.task_id!r} was being run by a worker that went "
            f"away inside the body (attempt {rec.attempts}; its lease ran out before it recorded an outcome), so "
            "whether it took effect is unknown. The tool's key cannot reach the provider (it takes no injected "
            "key and its on_unknown is 'hold'), so it was not run again: a person settles it with "
            f"`{command}`. Nothing was run.",
        )

    # -- answers that are not a run --------------------------------------------------------------------------

    def reuse_error(self, call: Call, rec: Record) -> KeyReuseError:
        try:
            stored: dict[str, str] = json.loads(rec.arg_hashes)
        except ValueError:
            stored = {}
        names = sorted(n for n in stored.keys() | call.arg_hashes.keys() if stored.get(n) != call.arg_hashes.get(n))
        differ = ", ".join(names) or "unknown arguments"
        self.events.emit("key_reuse", call, rec.attempts, differ)
        earlier = earlier_attempt(rec)
        return call.error(  # type: ignore[no-any-return]
            KeyReuseError, f"{call.operation!r} in task {call.task_id!r} was already called with different "
            f"arguments (differing: {differ}): {earlier}; the tool was not run. Use a new task id for a different "
            "operation.",
            differing=names, earlier=earlier,
        )

    def in_progress(self, call: Call, rec: Record, why: str) -> InProgressError:
        return call.error(  # type: ignore[no-any-return]
            InProgressError, f"{call.operation!r} in task {call.task_id!r} is being run by another caller "
            f"(attempt {rec.attempts}); {why}. This call did not run it; retry the same call shortly.",
        )

    def lease_lost(self, claim: Claim) -> LeaseLostError:
        call = claim.call
        self.events.emit("lease_lost", call, claim.attempt, "result refused")
        return call.error(  # type: ignore[no-any-return]
            LeaseLostError, f"the lease on {call.operation!r} in task {call.task_id!r} expired and another "
            "worker took over; this worker's outcome was not stored and the other worker's stands",
        )

    @staticmethod
    def not_run(call: Call, exc: StoreError) -> StoreError:
        """The store's fact, with what it means before the body: nothing ran."""
        return call.error(StoreError, f"{exc}; the tool was not run", transient=exc.transient)  # type: ignore[no-any-return]

    def held(self, call: Call, exc: StoreError, retried: bool) -> StoreError:
        """The store's fact, with what it means after the body: the claim stays held; after its lease, a takeover
        with the same key, or (a key that cannot reach the provider) a person, settles it."""
        retry = f" (retried for {self.window:g}s, the guard's outage_window)" if retried else ""
        then = ("the next caller takes over with the same downstream key" if call.on_unknown != "hold" else
                "later calls get OutcomeUnknownError until a person settles it (agentguard resolve), as the key "
                "cannot reach the provider")
        return call.error(  # type: ignore[no-any-return]
            StoreError, f"{exc}{retry}; the tool body already ran, so the claim is left held: after the lease "
            f"expires {then}", body_ran=True, transient=exc.transient,
        )

    # -- record: succeed | fail --------------------------------------------------------------------------------

    def settled(self, claim: Claim, what: str, write: Request, *, heartbeat: bool = True) -> Plan[Any]:
        """A store write made after the body ran: the completion, a release, a step's result.

        Each is fenced and idempotent for its fence, so through a short outage it is redone (each attempt
        reconnecting, with backoff) until it lands or ``outage_window`` passes; giving up sooner would leave
        the claim held and let a takeover run the body a second time. ``heartbeat``: the body is over and its
        heartbeat stopped, so renew the lease while waiting (stopped again before each attempt, so a renewal
        never races the write). Only a longer outage ends in ``StoreError(body_ran=True)``.
        """
        try:
            return (yield write)
        except StoreError as exc:
            if not exc.transient or self.window <= 0:
                raise self.held(claim.call, exc, retried=False) from exc
            error = exc
        call = claim.call
        deadline = time.monotonic() + self.window
        log.warning("the store failed while %s of %s (%s); retrying for up to %gs", what, call.operation,
                    error, self.window)
        delay = 0.05
        while True:
            if heartbeat:
                yield ResumeBeat(claim)
            yield Pause(min(delay * (0.5 + random.random()), max(deadline - time.monotonic(), 0.0)))
            if heartbeat:
                yield StopBeat(claim)
            try:
                result = yield write
            except StoreError as exc:
                if not exc.transient or time.monotonic() >= deadline:
                    raise self.held(call, exc, retried=True) from exc
                delay = min(delay * 2, 1.0)
                continue
            log.info("%s of %s landed after the store came back", what.capitalize(), call.operation)
            return result

    def succeed(self, claim: Claim, value: Any) -> Plan[Any]:
        """Record what the body returned; the value every caller receives (decoded from what is stored)."""
        call = claim.call
        yield StopBeat(claim)
        try:
            encoded, decoded = call.codec.store(value)
        except Exception as exc:  # (refused by the annotation, no stored form, or the value's own code raised)
            raise (yield from self.not_stored(claim, exc)) from None
        started = time.monotonic()  # before the database computes expires_at: the cache entry dies first
        if not (yield from self.settled(claim, "storing the result", Complete(
            call.scope, call.key, claim.fence, SUCCEEDED, encoded, self.retention, claim.audit()
        ))):
            raise self.lease_lost(claim)
        self.completed(claim, encoded, started)
        return decoded

    def not_stored(self, claim: Claim, exc: Exception) -> Plan[ResultNotStoredError]:
        """The body ran but its result cannot be stored: that outcome is recorded in its place (fenced, through
        a short outage like any completion), so no takeover ever runs the body again; the error to raise."""
        call = claim.call
        why = str(exc) if isinstance(exc, TypeError | ValueError) else f"reading it raised {type(exc).__name__}: {exc}"
        self.events.emit("not_stored", call, claim.attempt, why)
        error: ResultNotStoredError = call.error(
            ResultNotStoredError, f"the result of {call.operation!r} in task {call.task_id!r} could not be stored "
            f"({why}). The tool body ran, so this is recorded as its outcome and the body is never run again for "
            "this operation: every later call gets this error. A person settles it with "
            f"`{resolve_command(getattr(self.store, 'url', ''), call.key, call.scope)}`",
        )
        stored = _codec.encode_error(error)
        if not (yield from self.settled(claim, "recording that the result could not be stored", Complete(
            call.scope, call.key, claim.fence, FAILED, stored, self.retention, claim.audit()
        ))):
            raise self.lease_lost(claim)
        self.watches.news((call.scope, call.key))  # (not cached: a person may settle it meanwhile)
        return error

    def completed(self, claim: Claim, encoded: str, started: float) -> None:
        """The result was recorded: remembered here, this process's waiters told, the event reported."""
        call = claim.call
        self.remember(claim, SUCCEEDED, encoded, started)
        self.watches.news((call.scope, call.key))
        self.events.emit("completed", call, claim.attempt)

    def remember(self, claim: Claim, state: str, stored: str, started: float) -> None:
        call = claim.call
        if self.cache.maxsize:
            rec = record_of((call.scope, call.key, state, claim.fence, call.fingerprint, call.arg_hashes_json,
                             stored, claim.attempt, None, call.task_id, call.operation, False, False,
                             self.retention, claim.origin))
            self.cache.put(rec, started + self.retention)

    def fail(self, claim: Claim, exc: BaseException) -> Plan[tuple[str, str]]:
        """Record what the body's exception means: a cached error stored, or the claim released. Returns the
        ledger's kind and detail for it."""
        call = claim.call
        yield StopBeat(claim)
        if isinstance(exc, Exception) and call.cache_errors and isinstance(exc, call.cache_errors):
            stored = _codec.encode_error(exc)
            started = time.monotonic()
            if not (yield from self.settled(claim, "storing the cached error", Complete(
                call.scope, call.key, claim.fence, FAILED, stored, self.retention, claim.audit()
            ))):
                raise self.lease_lost(claim) from exc
            self.remember(claim, FAILED, stored, started)
            self.watches.news((call.scope, call.key))
            self.events.emit("completed", call, claim.attempt, f"cached error {type(exc).__name__}")
            return RAN, f"failed: cached error {type(exc).__name__}"
        # Released in its own statement on a fresh connection, never inside a failed transaction. A body that
        # never started (NotStarted) binds no arguments: the next call runs with its own.
        release = Release(call.scope, call.key, claim.fence, self.retention, claim.audit(), type(exc).__name__,
                          not isinstance(exc, NotStarted))
        try:
            released = yield from self.settled(claim, "releasing the claim", release)
        except GuardError as store_exc:
            exc.add_note(f"agentguard: the claim could not be released ({store_exc}); it expires with its lease")
            return RELEASED_KIND, f"{type(exc).__name__}; the release failed: the claim expires with its lease"
        if released:
            self.watches.news((call.scope, call.key))
            self.events.emit("released", call, claim.attempt, type(exc).__name__)
            return RELEASED_KIND, type(exc).__name__
        self.events.emit("lease_lost", call, claim.attempt, "release refused")
        return LEASE_LOST, "release refused"


def earlier_attempt(rec: Record) -> str:
    """What became of the call a record keeps, in words, for a refusal that names it."""
    if rec.state == SUCCEEDED:
        return "the earlier call ran and succeeded, and its result stands"
    if rec.state == FAILED:
        if held(rec):
            return "the earlier call ran, but its result could not be stored; it is held for a person"
        return f"the earlier call ran and failed with {_raised(rec.result)}, which is recorded as its outcome"
    if rec.state == RELEASED:
        return (f"an earlier attempt ran and failed with {rec.result or 'an error'}; nothing was recorded, so "
                "repeating it with exactly its arguments runs it again")
    return "the earlier call is running, or its worker went away while running it"


def _raised(stored: str | None) -> str:
    """The class name of a recorded error (``_codec.encode_error``)."""
    try:
        return str(json.loads(stored or "")["type"]).rpartition(":")[2].rpartition(".")[2] or "an error"
    except (ValueError, KeyError, TypeError):
        return "an error"


def held(rec: Record) -> bool:
    """A completed record that holds the operation for a person (its result could not be stored)."""
    return rec.state == FAILED and rec.result is not None and rec.result.startswith(NOT_STORED_PREFIX)
