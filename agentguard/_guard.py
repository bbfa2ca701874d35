"""Guard: the public face — configuration, lifecycle, ``run``/``run_sync``, the ``once`` decorator and the
administration of multi-step operations. The decisions live in ``agentguard._machine``; a guard builds calls
(``agentguard._calls``, ``agentguard._spec``) and hands them to a driver of its machine (``agentguard._drive``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypedDict, TypeVar, Unpack, cast, overload

from . import _codec
from ._admin import Admin
from ._cache import ReplayCache
from ._calls import Call, Outcome, check_errors, check_operation, make_call
from ._codec import Codec
from ._context import task as _task_ctx
from ._drive import drive, drive_sync
from ._errors import GuardError, MissingTaskError, OutcomeUnknownError, RecordChangedError
from ._events import Events, GuardEvent
from ._ledger import Ledger
from ._machine import Machine
from ._observe import Observer
from ._operation import Reconcile
from ._portal import Portal
from ._shapes import Shape
from ._shapes import key_shape as shape_of
from ._spec import KeyOption, Spec
from ._storeconfig import DEFAULT_URL, ENV_URL
from .stores import ChainCheck, ClaimStore, Listing, RecordDetail, SQLStore, Store
from .stores._attempts import FORGOTTEN, RESOLVED, Attempt
from .stores._decisions import How, applied, changed, parse_revision, said
from .stores._decisions import revision as revision_of
from .stores._protocols import is_claim_store, keeps_ledger

__all__ = ["DEFAULT_URL", "Guard", "GuardEvent", "OnceOptions", "Outcome", "RunOptions"]

log = logging.getLogger("agentguard")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

DEFAULT_LEASE = 30.0
DEFAULT_RETENTION = timedelta(days=7)
EXIT_WAIT = 5.0  # seconds the process's exit waits, at most, for its guards' last ledger entries (all guards)
_UNSET: Any = object()

# Every guard of the process, closed at its exit if nobody closed it (``_close_at_exit``).
_GUARDS: weakref.WeakSet[Guard] = weakref.WeakSet()


class RunOptions(TypedDict, total=False):
    """The options of :meth:`Guard.run` and :meth:`Guard.run_sync`."""

    arguments: Mapping[str, Any] | None
    key: Mapping[str, Any] | str | None
    task_id: str | None
    scope: str | None
    returns: Any
    cache_errors: tuple[type[BaseException], ...]
    on_conflict: Literal["wait", "raise"] | None
    wait_timeout: float | None
    audit: Mapping[str, Any] | None
    on_unknown: Literal["retry", "hold"]


class OnceOptions(TypedDict, total=False):
    """The options of :meth:`Guard.once`."""

    operation: str | None
    key: KeyOption
    ignore: Sequence[str]
    cache_errors: tuple[type[BaseException], ...]
    inject: str | None
    key_shape: Shape
    on_unknown: Literal["retry", "reconcile", "hold"]
    reconcile: Reconcile | None
    resumable: bool


def _seconds(value: float | timedelta, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
        raise ValueError(f"{what} must be a positive number of seconds or a timedelta, got {value!r}")
    return float(seconds)


def _otel_dropped(n: int) -> None:
    from ._otel import current

    otel = current()
    if otel is not None:
        otel.dropped.add(n)


class Guard:
    """Runs side-effecting tools at most once per (scope, task, operation) and replays the outcome.

    ``url``: ``sqlite+aiosqlite:///path.db`` (default ``$AGENTGUARD_URL``, else ``agentguard.db`` in the
    working directory), ``sqlite+aiosqlite://`` for an in-memory store in tests, or
    ``postgresql+asyncpg://user@host/db`` for a fleet of workers. ``store``: instead of a URL, any object
    implementing :class:`agentguard.stores.Store` (an ``SQLStore`` you made, a stand-in for a benchmark, a
    store wrapped to inject a fault in a test); the store options (``pool_size`` ...) then do not apply.
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
        max_connections: int | None = None,
        connect_timeout: float = 10.0,
        sqlite_synchronous: str = "FULL",
        pg_synchronous_commit: str | None = None,
        pg_claim_unsynced: bool = False,
        cache_size: int = 1024,
        outage_window: float | timedelta | None = None,
        store: ClaimStore | None = None,
        ledger: bool = True,
    ) -> None:
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
        owned = store is None  # (a store given is the caller's: its connections are theirs to close)
        if store is None:
            store = SQLStore(
                url or os.environ.get(ENV_URL) or DEFAULT_URL, pool_size=pool_size, max_connections=max_connections,
                connect_timeout=connect_timeout,
                sqlite_synchronous=sqlite_synchronous, pg_synchronous_commit=pg_synchronous_commit,
                pg_claim_unsynced=pg_claim_unsynced,
            )
        elif url is not None:
            raise ValueError("give a store URL or a store object, not both")
        elif not is_claim_store(store):
            raise TypeError("store must implement agentguard.stores.ClaimStore (claim, read, complete, ...) and, for "
                            f"multi-step tools and upkeep, StepStore and AdminStore; got {type(store).__qualname__}")
        # (the StepStore/AdminStore verbs a stand-in lacks fail when first used)
        guarded = cast(Store, store)
        self._portal = Portal()
        _GUARDS.add(self)
        self._codecs: dict[Any, Codec] = {}
        self._resumable: dict[str, Callable[..., Any]] = {}
        cache = ReplayCache(cache_size)
        # The ledger of attempts, written off the callers' path (a stand-in store without its verbs keeps none).
        kept = (Ledger(guarded, self._portal, self._retention, on_drop=_otel_dropped)
                if ledger and keeps_ledger(guarded) else None)
        machine = Machine(guarded, self._portal, lease=self._lease, retention=self._retention, window=self._window,
                          events=Events(on_event), cache=cache, observer=Observer(kept))
        self._store, self._machine, self._ledger, self._cache = guarded, machine, kept, cache
        self._admin = Admin(guarded, machine, kept, cache, self._retention)  # what a person reads (below)
        weakref.finalize(self, _let_go, self._portal, kept, guarded, owned).atexit = False  # (at exit: below)

    # -- what a person reads, and the one deliberate delete (``_admin``) ---------------------------------

    @property
    def ledger_dropped(self) -> int:
        """Ledger entries this guard dropped because the store did not keep up or refused them (the calls were
        unaffected)."""
        return self._admin.ledger_dropped

    async def flush_ledger(self) -> None:
        """Write the ledger entries queued so far (the writer writes them within ``_ledger.INTERVAL``, 0.2 s,
        anyway; this guard's own reads flush first)."""
        await self._admin.flush_ledger()

    async def attempts(
        self, *, key: str | None = None, task_id: str | None = None, scope: str | None = None,
        since: float | None = None, limit: int = 1000,
    ) -> list[Attempt]:
        """Ledger entries, oldest first: of the record ``key``, else of the task ``task_id``, else all;
        ``scope``: only that scope's; ``since``: only those at or after it (seconds since the epoch).

        What this guard queued is written first; another process's entries are read once its writer wrote them
        (within ``_ledger.INTERVAL``, 0.2 s, while its store keeps up). An attempt whose worker went away before
        writing anything (its process died) is read from its record once its lease ran out: a ``went_away``
        entry (``id`` 0) until whoever takes it over, or settles it, writes it."""
        return await self._admin.attempts(key=key, task_id=task_id, scope=scope, since=since, limit=limit)

    async def timeline(self, task_id: str, *, scope: str | None = None, limit: int = 1000) -> list[Attempt]:
        """What the agent did in ``task_id``, in order (every attempt and operator's act); raises GuardError if
        the store knows no such task."""
        return await self._admin.timeline(task_id, scope=scope, limit=limit)

    async def verify_ledger(self, *, scope: str | None = None) -> list[ChainCheck]:
        """Walk each scope's hash chain of ledger entries and operators' acts (or ``scope``'s), in one snapshot:
        a :class:`agentguard.stores.ChainCheck` per scope, with the first entry that was edited, deleted or
        reordered, if any (``agentguard verify``). What this guard queued is written first."""
        return await self._admin.verify_ledger(scope=scope)

    async def record(self, key: str, *, scope: str | None = None) -> RecordDetail:
        """The record ``key`` in full (with its steps); raises GuardError if there is none, or if several
        scopes hold the key and ``scope`` is not given."""
        return await self._admin.record(key, scope=scope)

    async def forget(self, key: str, *, scope: str | None = None) -> RecordDetail:
        """Delete a completed, failed or released record on purpose, so that the next call runs the tool
        again; never a running claim. Leaves a ``forgotten`` entry in the ledger. Returns what was deleted.

        Other processes that replayed the record recently may serve it from their in-process cache until it
        expires there (``Guard(cache_size=0)`` keeps none)."""
        return await self._admin.forget(key, scope=scope)

    async def stats(self, *, since: float | None = None, scope: str | None = None,
                    limit: int = 1_000_000) -> list[dict[str, Any]]:
        """Per tool, from the ledger: calls, replays and the replay rate, refusals, takeovers, and the guard's
        own time per call (p50, p99, in milliseconds), and attempts whose worker went away (``went_away``: their
        process died or stalled past its lease before it recorded an outcome). ``since``: seconds since the
        epoch."""
        return await self._admin.stats(since=since, scope=scope, limit=limit)

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

    def _codec_for(self, annotation: Any) -> Codec:
        try:
            codec = self._codecs.get(annotation)
        except TypeError:  # unhashable annotation
            return Codec(annotation)
        if codec is None:
            codec = self._codecs[annotation] = Codec(annotation)
        return codec

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
        """Write the ledger entries still queued, dispose the engines of this loop and of the portal. The
        guard can be used again afterwards."""
        await self._store.dispose()
        if self._portal.started:
            if self._ledger is not None:
                await self._portal.arun(self._ledger.flush())
            await self._portal.arun(self._store.dispose())
            self._portal.stop()

    def close(self) -> None:
        """Close from sync code: writes the ledger entries still queued, disposes the portal's engine and stops
        the portal."""
        if self._portal.started:
            if self._ledger is not None:
                self._portal.run(self._ledger.flush())
            self._portal.run(self._store.dispose())
            self._portal.stop()

    def _close_by(self, deadline: float) -> None:
        """:meth:`close` at the process's exit, given until ``deadline`` (``time.monotonic``): past it, the entries
        still queued are left unwritten. Entries left unwritten, or dropped because the store failed, are said."""
        portal, ledger = self._portal, self._ledger
        if not portal.started:
            return
        dropped = 0 if ledger is None else ledger.dropped
        try:
            for step in ((ledger.flush,) if ledger is not None else ()) + (self._store.dispose,):
                portal.run(step(), timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            log.warning("at the process's exit, a guard's last ledger entries were not written within %.0f s: %d "
                        "left unwritten (closing the guard before the exit waits for them)", EXIT_WAIT,
                        0 if ledger is None else len(ledger.queue))
            return  # (its loop still runs the step cut off: it ends with the process)
        except Exception as exc:  # (the flush drops and counts what the store failed to take; this is the rest)
            log.warning("closing a guard at the process's exit failed: %s", exc)
        if ledger is not None and ledger.dropped > dropped:
            log.warning("at the process's exit, the store failed to take a guard's last %d ledger entries (%s); "
                        "closing the guard before the exit writes them while the store can",
                        ledger.dropped - dropped, ledger.failure)
        portal.stop()

    # -- the store, for audit and upkeep --------------------------------------------------------------

    async def sweep(self, batch: int = 1000) -> int:
        """Delete records past their retention (and then ledger entries past theirs), in short paced batches of
        at most ``batch`` records, so that claims beside it keep their pace. Returns how many records were
        deleted."""
        if batch < 1:
            raise ValueError("batch must be at least 1")
        deleted = await self._machine.store_call(self._store.sweep(batch))
        if keeps_ledger(self._store):  # the ledger's entries carry their own expiry
            await self._machine.store_call(self._store.sweep_attempts(batch))
        return deleted

    async def records(
        self, *, scope: str | None = None, task_id: str | None = None, limit: int = 100, state: str | None = None
    ) -> Sequence[Listing]:
        """The most recently updated records, for audit (``agentguard ls``); ``state``: only those in it."""
        return await self._machine.store_call(self._store.listing(scope=scope, task_id=task_id, limit=limit,
                                                                 state=state))

    async def ensure_schema(self) -> None:
        await self._machine.store_call(self._store.ensure_schema())

    # -- guarding calls -------------------------------------------------------------------------------

    def _run_call(self, operation: str, options: RunOptions) -> Call:
        unknown = options.keys() - RunOptions.__annotations__.keys()
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        check_operation(operation)
        on_unknown = options.get("on_unknown", "hold")
        if on_unknown not in ("retry", "hold"):
            raise ValueError(f"on_unknown must be 'retry' or 'hold', got {on_unknown!r}")
        wait_timeout, audit = options.get("wait_timeout"), options.get("audit")
        audit_json = None if audit is None else _codec.dumps(dict(audit))
        try:
            call = make_call(
                operation, options.get("arguments") or {}, options.get("key"), options.get("task_id"),
                options.get("scope"), self._codec_for(options.get("returns", Any)),
                check_errors(options.get("cache_errors", ())), options.get("on_conflict") or self._on_conflict,
                self._wait_timeout if wait_timeout is None else wait_timeout, audit_json,
            )
        except MissingTaskError:
            self._machine.observer.missing_task(operation, audit_json)
            raise
        call.on_unknown = on_unknown
        return call

    async def run(
        self, operation: str, body: Callable[[str], Awaitable[T]], **options: Unpack[RunOptions]
    ) -> Outcome[T]:
        """Guard one call without a decorator (for adapters and proxies).

        ``body`` receives the downstream key. ``arguments`` are fingerprinted; ``key`` holds the values that
        tell operations apart within a task (a mapping, or a string); ``task_id`` and ``scope`` default to the
        ``task(...)`` context; ``returns`` is the result's type (stored and replayed through it);
        ``cache_errors`` are exception classes stored and replayed like results; ``on_conflict`` and
        ``wait_timeout`` override the guard's; ``audit`` is stored beside the record, never in the key.
        ``on_unknown``: when the worker of an earlier call went away inside ``body``, ``"hold"`` (the default)
        leaves the operation for a person (``OutcomeUnknownError`` until ``agentguard resolve``); ``"retry"``
        takes it over and runs ``body`` again with the same key — only where that key reaches the provider.
        """
        call = self._run_call(operation, options)
        value, replayed = await drive(self._machine, call, body)
        return Outcome(value, replayed, call.key, call.operation, call.task_id, call.scope)

    def run_sync(self, operation: str, body: Callable[[str], T], **options: Unpack[RunOptions]) -> Outcome[T]:
        """:meth:`run` for sync code: ``body`` runs in this thread; store calls go to the guard's portal."""
        call = self._run_call(operation, options)
        value, replayed = drive_sync(self._machine, call, body)
        return Outcome(value, replayed, call.key, call.operation, call.task_id, call.scope)

    @overload
    def once(self, fn: Callable[P, R], /) -> Callable[P, R]: ...

    @overload
    def once(self, fn: None = None, /, **options: Unpack[OnceOptions]) -> Callable[[Callable[P, R]], Callable[P, R]]:
        ...

    def once(
        self, fn: Callable[P, R] | None = None, /, **options: Unpack[OnceOptions]
    ) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
        """Run the decorated tool at most once per (scope, task, operation); replay its outcome after.

        ``operation``: the operation's name (default: the function's). ``key``: argument names whose values
        tell operations apart within a task (none: one operation per task), or a callable of the bound
        arguments returning a string. ``ignore``: arguments left out of the fingerprint. ``cache_errors``:
        exception classes stored and replayed like results. ``inject`` (default ``"idempotency_key"``): a
        parameter that receives the downstream key, hidden from the wrapper's signature; ``key_shape``
        writes that key for a provider that takes shorter ones (``"square"``, a maximum length, a
        ``downstream.KeyShape``; default: as it is, which Stripe and Adyen take). Multi-step tools (a
        parameter annotated ``Operation``): ``on_unknown`` (default ``"hold"``) says what a takeover does with a
        step whose worker died inside it — ``"retry"`` it with the same sub-key, ``"reconcile"`` it through
        ``reconcile(op, step, sub_key)`` (the provider's result, or None for "did not happen"), or ``"hold"``
        it with ``OutcomeUnknownError`` until ``agentguard resolve``. The same policy applies to the body of a
        tool whose worker died inside it when the key cannot reach the provider (no injected key parameter, no
        ``Operation``, not resumable): ``"hold"`` leaves it for a person, ``"reconcile"`` asks
        ``reconcile(op, tool_name, key)`` first, ``"retry"`` runs it again; a tool that takes the key always
        runs again with it. ``resumable``: store the arguments so ``complete_stalled()`` can finish abandoned
        operations. Every option is checked here, at decoration.
        """
        unknown = options.keys() - OnceOptions.__annotations__.keys()
        if unknown:
            raise TypeError(f"once() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        operation, on_unknown = options.get("operation"), options.get("on_unknown", "hold")
        reconcile, resumable = options.get("reconcile"), options.get("resumable", False)
        if operation is not None:
            check_operation(operation)
        if on_unknown not in ("retry", "reconcile", "hold"):
            raise ValueError(f"on_unknown must be 'retry', 'reconcile' or 'hold', got {on_unknown!r}")
        if (on_unknown == "reconcile") != (reconcile is not None):
            raise TypeError("on_unknown='reconcile' needs reconcile=<async fn(op, step, sub_key)>, and only it")
        errors = check_errors(options.get("cache_errors", ()))
        key_shape = None if options.get("key_shape") is None else shape_of(options.get("key_shape"))

        def decorate(f: Callable[P, R]) -> Callable[P, R]:
            spec = Spec(self._machine, self._codec_for, f, operation=operation, key=options.get("key"),
                        ignore=options.get("ignore", ()), cache_errors=errors,
                        inject=options.get("inject", "idempotency_key"), key_shape=key_shape,
                        on_conflict=self._on_conflict,
                        wait_timeout=self._wait_timeout, on_unknown=on_unknown, reconcile=reconcile,
                        resumable=resumable)
            wrapped: Callable[P, R] = spec.wrapper()
            if resumable:
                self._resumable[spec.tool] = wrapped
            return wrapped

        return decorate if fn is None else decorate(fn)

    # -- multi-step operations: stalled and held ones ----------------------------------------------------

    async def complete_stalled(self, *, limit: int = 100) -> list[Outcome[Any]]:
        """Push operations whose callers went away (lease expired or released, tool ``resumable=True``)
        through their remaining steps, with their stored arguments. Returns what each produced."""
        rows = await self._machine.store_call(self._store.stalled(limit=limit))
        done: list[Outcome[Any]] = []
        for scope, key, task_id, tool, arguments in rows:
            fn = self._resumable.get(tool)
            if fn is None:
                log.info("stalled operation %s (tool %s) has no resumable tool on this guard", key, tool)
                continue
            spec: Spec = fn.__agentguard__  # type: ignore[attr-defined]
            kwargs = spec.decode_arguments(arguments)
            with _task_ctx(task_id, scope=scope):
                call, _ = spec.call((), kwargs)
                value, replayed = await drive(self._machine, call, functools.partial(spec.invoke, (), kwargs, kwargs))
            done.append(Outcome(value, replayed, call.key, call.operation, call.task_id, call.scope))
        return done

    async def unknown(self, *, scope: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Operations held for a person, one each, the latest change first, with how (``held``): ``"step"``,
        its worker died inside a step (the first one started, named by ``step``); ``"body"``, its worker died
        inside the body (a tool whose key reaches the provider takes it over on its next call; any other waits
        for a person); ``"not_stored"``, the body ran and its result could not be stored. ``revision``: what a
        decision on it is made on (:meth:`resolve`)."""
        rows = await self._machine.store_call(self._store.unknown(scope=scope, limit=limit))
        names = ("scope", "key", "task_id", "operation", "step", "attempts", "age", "held")
        return [dict(zip(names, r[:8], strict=True), revision=revision_of(r[9], r[10], r[8], r[7], r[4]))
                for r in rows]

    async def resolve(
        self, key: str, *, scope: str = "default", result: Any = _UNSET, retry: bool = False, abandon: bool = False,
        revision: str | None = None,
    ) -> str:
        """Settle a held operation (:meth:`unknown`): record its ``result`` (a step's, or, for an operation
        held on its body, the operation's, which every later call then receives), or ``retry`` (the step, or the
        body, runs again on the next call), or ``abandon`` the operation (every later call raises
        ``OutcomeUnknownError``). Returns what was done.

        ``revision``: the record's revision the decision was made on (as :meth:`unknown`, ``agentguard ls
        --unknown`` and the console show it). The decision is then made only if the record still has it, in
        one transaction; if it changed meanwhile, ``RecordChangedError`` says what changed and nothing is
        written — unless what changed is exactly what this decision makes (the same decision sent twice, or by
        two people): then nothing is written and the answer starts with ``"already applied"``. Without it, the
        decision is made on the record as it is."""
        if sum((result is not _UNSET, retry, abandon)) != 1:
            raise ValueError("give exactly one of result=..., retry=True or abandon=True")
        seen = None if revision is None else parse_revision(revision)
        how: How = "abandon" if abandon else "retry" if retry else "result"
        abandoned = _codec.encode_error(
            OutcomeUnknownError(f"operation {key} was abandoned by an operator after an unknown outcome"))
        value = abandoned if abandon else None if retry else _codec.dumps(result)
        gone = await self._admin.gone(key, scope)  # (read before: the record stops saying its worker went away)
        decided = await self._machine.store_call(
            self._store.decide(scope, key, how, value, self._retention, seen=None if seen is None else seen.text))
        if decided.applied:
            self._cache.clear()
            done = said(how, decided.step)
            # A step settled leaves the record running: its next call takes it over and writes that entry then.
            await self._admin.operator_entries(key, scope, RESOLVED, done, gone if decided.step is None else None)
            return done
        now = decided.before
        if seen is not None and (now is None or now.revision != seen.text):
            again = applied(seen, now, how, value)
            if again is not None:
                return f"already applied: {again}; nothing was changed"
            acts = [] if now is None else await self._operator_acts(key, scope, seen.updated)
            what = changed(seen, now, abandoned, bool(acts))
            if acts:
                what += f" ({_act(acts[-1])})"
            raise RecordChangedError(
                f"refused: {key} changed since revision {seen.text}: {what}; nothing was changed"
                + (f". Its revision now: {now.revision}" if now is not None else ""),
                key=key, scope=scope, seen=seen.text, revision=None if now is None else now.revision)
        if abandon:
            raise GuardError(f"no held, released or stalled operation {key!r} in scope {scope!r} to abandon", key=key)
        raise GuardError(f"no operation {key!r} in scope {scope!r} is held on an unknown outcome", key=key)

    async def _operator_acts(self, key: str, scope: str, since: float) -> list[Attempt]:
        """The operators' acts on ``key`` the ledger holds since ``since`` (none where the guard keeps no ledger)."""
        if not keeps_ledger(self._store):
            return []
        entries = await self.attempts(key=key, scope=scope, since=since)
        return [e for e in entries if e.kind in (RESOLVED, FORGOTTEN)]


def _act(e: Attempt) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.at))
    return f"{e.detail}, by {e.process} at {when} UTC"


def _let_go(portal: Portal, ledger: Ledger | None, store: Store, owned: bool) -> None:
    """A guard collected without being closed (made per request, say, and dropped): the ledger entries it still
    queued are written and its connections closed in the background, and its portal's thread ends; nothing here
    waits (a finaliser runs wherever the collector does, the guard's own loop included)."""
    if sys.is_finalizing():  # (the process's exit closed it already: ``_close_at_exit``)
        return
    if owned and isinstance(store, SQLStore):
        store.dispose_soon(skip=portal.current)  # (each caller loop's engine; the portal's is closed by ``final``)

    async def final() -> None:
        if ledger is not None:
            await ledger.flush()
        if owned:
            await store.dispose()

    portal.end_soon(final)


@atexit.register
def _close_at_exit() -> None:
    """At the process's exit (after its non-daemon threads ended, while the portals' daemon threads still run),
    close every guard nobody closed: the ledger entries it still queued are written rather than lost, and its
    portal's connections closed rather than left to the interpreter's teardown. All of them within ``EXIT_WAIT``."""
    deadline = time.monotonic() + EXIT_WAIT
    for guard in list(_GUARDS):
        guard._close_by(deadline)
