"""What the guard asks of a store, as three small interfaces. ``SQLStore`` implements all of them; a stand-in
(an in-memory dict for a benchmark, a store wrapped to inject a fault in a test) implements what it needs.

Every write after the claim is conditional on the fence the caller holds, and answers False (never raises)
when the claim is no longer the caller's. A store that cannot answer raises ``StoreError`` saying what
failed, with ``body_ran`` (the verb runs after the tool body: completing, releasing, renewing, a step's
write) and ``transient`` (the failure looks like an outage that may pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeGuard, runtime_checkable

from sqlalchemy.ext.asyncio import AsyncConnection

from ._attempts import Attempt, RecordDetail
from ._decisions import Decided, How
from ._schema import Listing, Record


@runtime_checkable
class ClaimStore(Protocol):
    """The verbs of a guarded call's hot path: claim, replay, renew while the body runs, record or release.

    ``params`` of a claim: ``scope``, ``key``, ``task_id``, ``operation``, ``fingerprint``, ``arg_hashes``,
    ``fence`` (a fresh random fence for a new row), ``tool``, ``arguments``, ``owner`` (a token naming this
    attempt), ``lease`` and ``retention`` (seconds), ``audit``; a takeover's also ``fence`` (the one seen) and
    ``reset`` (1: the record was past retention, start it again as a new operation).
    """

    @property
    def url(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def memory(self) -> bool:
        """The database lives in one connection: use the store from one event loop only."""
        ...

    @property
    def read_is_cheaper(self) -> bool:
        """A plain :meth:`read` costs less than a :meth:`claim` that finds the record."""
        ...

    async def ensure_schema(self) -> None: ...

    async def dispose(self) -> None:
        """Let go of the running loop's connections (the store can be used again afterwards)."""
        ...

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> int | Record | None:
        """Our fence if we claimed the key; else the record there; None if it vanished meanwhile (claim
        again). ``likely_taken``: the caller expects the key held or done already (a replaying task's call, a
        caller looking again), so it may be asked the way that costs least then; the answer is the same."""
        ...

    async def read(self, scope: str, key: str) -> Record | None: ...

    async def take_over(self, params: dict[str, Any]) -> tuple[int, int] | None:
        """(fence, origin) if we took the claim over: it was released, its lease expired, or it was past
        retention, and nobody took it over since we read ``params["fence"]``."""
        ...

    async def renew(self, scope: str, key: str, fence: int, lease: float) -> bool: ...

    async def complete(
        self, scope: str, key: str, fence: int, state: str, result: str, retention: float, audit: str | None = None
    ) -> bool:
        """Record the outcome (``state`` succeeded or failed); idempotent for the fence that holds the claim.
        ``audit``: if given, replaces what is kept beside the record for a person (``Listing.audit``)."""
        ...

    async def release(self, scope: str, key: str, fence: int, retention: float, audit: str | None = None, *,
                      raised: str | None = None, bound: bool = True) -> bool:
        ...

    async def release_owned(self, scope: str, key: str, owner: str, retention: float) -> bool:
        """Release a claim that a cancelled claimer may or may not have won, recognised by its owner token."""
        ...


class Direct(Protocol):
    """The hot verbs in a sync tool's own thread (``_direct``: SQLite, ``_direct_pg``: Postgres; ``_verbs.SyncVerbs``):
    each asks the statements the ``ClaimStore`` verb of the same name asks, with the same parameters, and answers
    what it answers, or raises ``StoreError`` (the caller may then ask the store's own verb, the same way)."""

    def claim(self, params: dict[str, Any], likely_taken: bool = False) -> int | Record | None:
        """``likely_taken``: as for ``ClaimStore.claim`` (the same hint, the same plan)."""
        ...

    def read(self, scope: str, key: str) -> Record | None: ...

    def take_over(self, params: dict[str, Any]) -> tuple[int, int] | None: ...

    def renew(self, scope: str, key: str, fence: int, lease: float) -> bool: ...

    def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                 audit: str | None = None) -> bool: ...

    def release(self, scope: str, key: str, fence: int, retention: float, audit: str | None = None, *,
                raised: str | None = None, bound: bool = True) -> bool: ...

    def release_owned(self, scope: str, key: str, owner: str, retention: float) -> bool: ...

    def close(self) -> None: ...


@runtime_checkable
class StepTransaction(Protocol):
    """A transaction on the store's database that began by re-checking the claim (see
    :meth:`StepStore.step_transaction`)."""

    @property
    def connection(self) -> AsyncConnection:
        """For the caller's own statements, committed together with the step."""
        ...

    async def record(self, result: str) -> None:
        """Record the step done with ``result``, in this transaction."""
        ...


@runtime_checkable
class StepStore(Protocol):
    """The verbs of a multi-step operation (``Operation``): its steps under the claim's origin, each write in a
    transaction that first re-checks (and renews) the claim, so a stale worker can record nothing."""

    async def load_steps(self, scope: str, key: str, origin: int) -> list[tuple[str, int, str, str | None]]:
        """The recorded steps, (name, seq, state, result), in order."""
        ...

    async def put_step(
        self, scope: str, key: str, *, fence: int, origin: int, lease: float, name: str, seq: int, state: str,
        result: str | None,
    ) -> bool:
        """Record a step as started or done; False if the claim is no longer ours."""
        ...

    async def clear_step(self, scope: str, key: str, *, fence: int, origin: int, lease: float, name: str) -> bool:
        """Remove a started step's mark (it raised: its outcome is known); False if the claim is no longer ours."""
        ...

    def step_transaction(
        self, scope: str, key: str, *, fence: int, origin: int, lease: float, name: str, seq: int,
    ) -> AbstractAsyncContextManager[StepTransaction | None]:
        """A transaction for ``op.transaction``, or None (nothing opened durably) if the claim is no longer
        ours. Errors raised in the block pass through as they are, and roll it back."""
        ...


@runtime_checkable
class AdminStore(Protocol):
    """An operator's verbs: retention, audit, and operations whose worker died inside a step."""

    async def sweep(self, batch: int = 1000) -> int:
        """Delete records past their retention, in paced batches of at most ``batch``; never a running claim
        whose lease is live."""
        ...

    async def listing(
        self, *, scope: str | None = None, task_id: str | None = None, limit: int = 100, state: str | None = None
    ) -> Sequence[Listing]: ...

    async def unknown(self, *, scope: str | None = None, limit: int = 100, offset: int = 0) -> list[tuple[Any, ...]]:
        """(scope, key, task_id, operation, step, attempts, age, held, state, fence, updated_at, total) of
        operations held for a person, one row each, the latest change first: ``held`` says how
        (``_schema.HELD_KINDS``: a worker died inside a step, the first started named by ``step``, or inside the
        body; or the body's result could not be stored); ``total``: how many are held."""
        ...

    async def decide(self, scope: str, key: str, how: How, value: str | None, retention: float, *,
                     seen: str | None = None) -> Decided:
        """Settle a held record as ``how`` says (``value``: the encoded result, or the encoded error of an
        abandon), in one transaction, and only if its revision is still ``seen`` when that is given; what it
        found, and what it wrote (``_decisions``)."""
        ...

    async def hold(self, scope: str, key: str, fence: int) -> bool:
        """Mark a running record whose lease ran out (under ``fence``) as held on its body, for a person; nothing
        else changes (its worker, if only stalled, may still renew it). False if it changed meanwhile."""
        ...

    async def settle(self, scope: str, key: str, result: str | None, retention: float) -> bool:
        """Settle an operation held on its body: record ``result`` (an encoded value) as its outcome, or (None)
        release it so that its next call runs it again. False if it is not held so."""
        ...

    async def resolve_step(self, scope: str, key: str, name: str, state: str | None, result: str | None) -> bool:
        """Settle a started step: record it ``state`` (done) with ``result``, or (state None) clear it for a
        retry."""
        ...

    async def stalled(self, *, limit: int = 100) -> list[tuple[str, str, str, str, str]]:
        """(scope, key, task_id, tool, arguments) of resumable operations nobody holds."""
        ...

    async def abandon(self, scope: str, key: str, result: str, retention: float) -> bool:
        """Fail an operation nobody holds with ``result`` (an encoded error)."""
        ...


@runtime_checkable
class LedgerStore(Protocol):
    """The ledger of attempts (``stores/_attempts.py``) and an operator's look at one record. A store without
    these verbs (a stand-in) works; its guard keeps no ledger."""

    async def write_attempts(self, rows: Sequence[Sequence[Any]]) -> int:
        """Insert entries (each the values of ``_attempts.WRITTEN``, in order): how many the store refused for
        their own values and left out (the others were written); ``StoreError`` if none could be written."""
        ...

    async def read_attempts(
        self, *, key: str | None = None, task_id: str | None = None, scope: str | None = None,
        since: float | None = None, limit: int = 1000,
    ) -> list[Attempt]:
        """Entries in the order they happened: of one key, of one task, or all since ``since``."""
        ...

    async def sweep_attempts(self, batch: int = 1000) -> int: ...

    async def record_details(self, key: str, scope: str | None = None) -> list[RecordDetail]: ...

    async def forget(self, scope: str, key: str) -> bool:
        """Delete a record that is not running, and its steps; False if there is none such."""
        ...

    async def task_known(self, task_id: str) -> bool: ...


@runtime_checkable
class Store(ClaimStore, StepStore, AdminStore, Protocol):
    """Everything a ``Guard`` asks of its store."""


def _has_members(obj: object, protocol: type) -> bool:
    """Whether ``obj`` has every member of ``protocol``, found as any attribute is — a wrapper that delegates
    through ``__getattr__`` included, which ``isinstance`` stopped seeing for runtime-checkable protocols in
    Python 3.12."""
    members = getattr(protocol, "__protocol_attrs__", None) or [n for n in dir(protocol) if not n.startswith("_")]
    return all(hasattr(obj, name) for name in members)


def is_claim_store(obj: object) -> TypeGuard[ClaimStore]:
    return _has_members(obj, ClaimStore)


def keeps_ledger(obj: object) -> TypeGuard[LedgerStore]:
    return _has_members(obj, LedgerStore)
