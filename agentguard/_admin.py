"""An operator's verbs over a guard's store: the ledger of attempts, one record in full, a task's timeline,
per-tool statistics, and the one deliberate delete, ``forget``. A ``Guard`` holds one (``Guard._admin``) and
answers its reading verbs with it (their documentation is ``Guard``'s, where users read it).

The read API is stable (a console's task timeline is built on it): ``attempts`` and ``timeline`` return
:class:`agentguard.stores.Attempt` entries oldest first; ``record`` a :class:`agentguard.stores.RecordDetail`;
``stats`` plain dicts (the fields of ``agentguard stats --json``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import GuardError, StoreError
from .stores import RUNNING, Attempt, ChainCheck, LedgerStore, RecordDetail
from .stores._attempts import (
    DROPPED,
    FORGOTTEN,
    REFUSED,
    REPLAYED,
    RESOLVED,
    TOOK_OVER,
    WENT_AWAY,
)
from .stores._protocols import keeps_ledger

if TYPE_CHECKING:
    from ._cache import ReplayCache
    from ._ledger import Ledger
    from ._machine import Machine
    from .stores import Store

T = TypeVar("T")
_OPERATOR = (RESOLVED, FORGOTTEN, DROPPED)  # entries that are not a call


class Admin:
    """The reading and forgetting verbs of a guard, over its store, its machine (where the store is used), its
    ledger writer (what is still queued) and its replay cache (emptied when a record is forgotten)."""

    def __init__(self, store: Store, machine: Machine, ledger: Ledger | None, cache: ReplayCache,
                 retention: float) -> None:
        self._store, self._machine, self._ledger, self._cache = store, machine, ledger, cache
        self._retention = retention

    def _ledger_store(self) -> LedgerStore:
        store = self._store
        if not keeps_ledger(store):
            raise GuardError(f"this guard's store ({type(store).__qualname__}) keeps no ledger of attempts")
        return store

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await self._machine.store_call(coro)

    @property
    def ledger_dropped(self) -> int:
        return 0 if self._ledger is None else self._ledger.dropped

    async def flush_ledger(self) -> None:
        if self._ledger is not None:
            await self._machine.portal.arun(self._ledger.flush())

    async def read_own_writes(self) -> None:
        # A read in the process that wrote sees what it wrote: what is still queued (or being written) first.
        if self._ledger is not None and self._ledger.pending:
            await self.flush_ledger()

    async def attempts(
        self, *, key: str | None = None, task_id: str | None = None, scope: str | None = None,
        since: float | None = None, limit: int = 1000,
    ) -> list[Attempt]:
        await self.read_own_writes()
        return await self._call(self._ledger_store().read_attempts(key=key, task_id=task_id, scope=scope,
                                                                   since=since, limit=limit))

    async def timeline(self, task_id: str, *, scope: str | None = None, limit: int = 1000) -> list[Attempt]:
        store = self._ledger_store()
        await self.read_own_writes()
        entries = await self._call(store.read_attempts(task_id=task_id, scope=scope, limit=limit))
        if not entries and not await self._call(store.task_known(task_id)):
            raise GuardError(f"no task {task_id!r} in this store: no record or attempt names it", task_id=task_id)
        return entries

    async def verify_ledger(self, *, scope: str | None = None) -> list[ChainCheck]:
        await self.read_own_writes()
        return await self._call(self._ledger_store().verify_ledger(scope))

    async def record(self, key: str, *, scope: str | None = None) -> RecordDetail:
        found = await self._call(self._ledger_store().record_details(key, scope))
        if not found:
            where = f" in scope {scope!r}" if scope is not None else ""
            raise GuardError(f"no record {key!r}{where} (never recorded, forgotten, or swept after its retention)",
                             key=key)
        if len(found) > 1:
            raise GuardError(f"the key {key!r} is recorded in several scopes ({', '.join(r.scope for r in found)}); "
                             "name one with scope=... (--scope)", key=key)
        return found[0]

    async def forget(self, key: str, *, scope: str | None = None) -> RecordDetail:
        rec = await self.record(key, scope=scope)
        if rec.state == RUNNING:
            why = ("its lease is live: a worker is running it" if rec.lease_left is not None and rec.lease_left > 0
                   else "its worker went away: `agentguard resolve` settles it, or the next call of a tool whose "
                        "key reaches the provider takes it over with the same downstream key")
            raise GuardError(f"refused: {key!r} is a running claim ({why}); only a completed, failed or released "
                             "record can be forgotten", key=key, task_id=rec.task_id, operation=rec.operation)
        store = self._ledger_store()
        if not await self._call(store.forget(rec.scope, key)):
            raise GuardError(f"{key!r} changed meanwhile (claimed again?); look again", key=key)
        self._cache.clear()
        await self._operator_entry(rec, FORGOTTEN, f"was {rec.state}")
        return rec

    async def gone(self, key: str, scope: str) -> list[Attempt]:
        """The record's attempt whose worker went away with nothing written (read from the record), if any: an
        operator settling the record writes it (the record stops saying so)."""
        if not keeps_ledger(self._store):
            return []
        entries = await self._call(self._store.read_attempts(key=key, scope=scope))
        return [e for e in entries if e.kind == WENT_AWAY and e.id == 0]

    async def operator_entries(self, key: str, scope: str, kind: str, detail: str,
                                gone: list[Attempt] | None = None) -> None:
        """The ledger's entry of an operator's act on the record ``key`` of ``scope`` (``resolve``), after the
        ``went_away`` entry of the attempt it settles (``gone``: read before the act)."""
        if keeps_ledger(self._store):
            for rec in await self._call(self._store.record_details(key, scope)):
                for e in gone or ():
                    settled = f"{e.detail.rpartition('; ')[0]}; settled by an operator: {detail}"
                    await self._operator_entry(rec, WENT_AWAY, settled, attempt=e.attempt, about=e.process)
                await self._operator_entry(rec, kind, detail)

    async def _operator_entry(self, rec: RecordDetail, kind: str, detail: str, *, attempt: int | None = None,
                              about: str | None = None) -> None:
        from ._ledger import process

        if not keeps_ledger(self._store):
            return
        await self.read_own_writes()  # (the act follows, in its chain too, what this guard saw happen)
        at = time.time()
        entry = (rec.scope, rec.key, rec.task_id, rec.operation, rec.tool, kind, detail,
                 rec.attempts if attempt is None else attempt, None, about or process(), at, None, None,
                 at + self._retention)
        if await self._call(self._store.write_attempts([entry])):
            raise StoreError(f"the store refused the ledger's entry of {kind} {rec.key!r} (see the log)", key=rec.key)

    async def stats(self, *, since: float | None = None, scope: str | None = None,
                    limit: int = 1_000_000) -> list[dict[str, Any]]:
        entries = await self.attempts(since=since, scope=scope, limit=limit)
        by_tool: dict[str, list[Attempt]] = {}
        for e in entries:
            if e.kind not in _OPERATOR:
                by_tool.setdefault(e.tool, []).append(e)
        out = []
        for tool, calls in sorted(by_tool.items()):
            times = sorted(e.guard_ms for e in calls if e.guard_ms is not None)
            replayed = sum(e.kind == REPLAYED for e in calls)
            out.append({
                "tool": tool, "calls": len(calls), "replayed": replayed, "replay_rate": replayed / len(calls),
                "refused": sum(e.kind == REFUSED for e in calls), "took_over": sum(e.kind == TOOK_OVER for e in calls),
                "went_away": sum(e.kind == WENT_AWAY for e in calls),
                "guard_ms_p50": _rank(times, 0.50), "guard_ms_p99": _rank(times, 0.99),
            })
        return out


def _rank(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile of sorted ``values``."""
    if not values:
        return None
    return values[max(math.ceil(q * len(values)) - 1, 0)]
