"""What every part of the benchmark shares: the tool, the stores handed to ``Guard(store=...)`` (a wrapper that
records the verbs a guarded call asks of a real store, and a no-I/O stand-in), and the raw drivers, which run
the store's own statements with the parameters a real guarded call passed to its store."""

from __future__ import annotations

import hashlib
import inspect
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentguard import Guard, task
from agentguard._lease import new_owner
from agentguard.stores import Record, SQLStore, Store, record_of

AMOUNT = 4900


@dataclass
class Body:
    """The money-moving tool: a trivial body (so the guard's cost shows), counting how often it ran."""

    runs: int = 0

    def result(self, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        self.runs += 1
        return {"charge_id": "ch_" + idempotency_key[3:27], "order_id": order_id, "amount_cents": amount_cents,
                "currency": "eur", "status": "succeeded"}

    async def __call__(self, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        return self.result(order_id, amount_cents, idempotency_key)


def guarded(guard: Guard, body: Body) -> Callable[..., Awaitable[dict[str, Any]]]:
    """``@guard.once(key=["order_id"])`` over a fresh function that calls ``body``: the public API only."""

    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        return await body(order_id, amount_cents, idempotency_key)

    return charge


def guarded_sync(guard: Guard, body: Body) -> Callable[..., dict[str, Any]]:
    """:func:`guarded` as a sync tool (the same operation, so the same keys): its statements made in the caller's
    thread where the store can (``SQLStore.direct``)."""

    @guard.once(key=["order_id"])
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        return body.result(order_id, amount_cents, idempotency_key)

    return charge


def pin_one_cpu() -> None:
    """One CPU for this process and all it starts (its Postgres, redis-server, the DBOS peer; aiosqlite's threads):
    a round trip or thread hop then costs the same on every connection, where otherwise it costs about 2.5x more on
    those whose other end the scheduler happened to place on another CPU. (Where the OS cannot pin: nothing.)"""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def fake_key(*parts: object) -> str:
    """A key shaped like the guard's (``ag_`` + 48 hex digits), for the raw-driver variants."""
    return "ag_" + hashlib.sha256(repr(parts).encode()).hexdigest()[:48]


def run_id() -> str:
    return secrets.token_hex(4)


# -- stores passed to Guard(store=...) ---------------------------------------------------------------------

MEMBERS = tuple(n for n in dir(Store) if not n.startswith("_"))  # the public protocol's verbs and properties


def _complete(cls: type, make: Callable[[str, Any], Any]) -> None:
    """Give ``cls`` every member of the ``Store`` protocol it does not define, as ``make(name, member)``."""
    for name in MEMBERS:
        if name not in vars(cls):
            setattr(cls, name, make(name, getattr(Store, name)))


class Recording:
    """Any store, each verb the guard asks of it appended to ``log[-1]`` as (verb, its arguments by name)."""

    def __init__(self, inner: Store, log: list[list[tuple[str, dict[str, Any]]]]) -> None:
        self.inner, self.log = inner, log


def _forward(name: str, member: Any) -> Any:
    if isinstance(member, property):
        return property(lambda self: getattr(self.inner, name))
    sig = inspect.signature(member)

    def verb(self: Recording, *args: Any, **kwargs: Any) -> Any:
        bound = dict(sig.bind(self, *args, **kwargs).arguments)
        del bound["self"]
        self.log[-1].append((name, {**bound.pop("params", {}), **bound}))
        return getattr(self.inner, name)(*args, **kwargs)

    return verb


_complete(Recording, _forward)


class NoIOStore:
    """A stand-in store that answers at once from a dict: what the guard's own Python costs with no I/O.
    It implements the verbs of a call's hot path (claim, read, complete) and raises on every other one."""

    url, backend, memory, read_is_cheaper = "memory://no-io", "no-io", False, False

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Any] = {}  # the claim's parameters while running; then a Record

    async def ensure_schema(self) -> None:
        return None

    async def dispose(self) -> None:
        return None

    async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> int | Record | None:
        got = self.rows.setdefault((params["scope"], params["key"]), params)
        return params["fence"] if got is params else got  # type: ignore[no-any-return]

    async def read(self, scope: str, key: str) -> Record | None:
        return self.rows.get((scope, key))

    async def complete(
        self, scope: str, key: str, fence: int, state: str, result: str, retention: float, audit: str | None = None
    ) -> bool:
        p = self.rows[(scope, key)]
        self.rows[(scope, key)] = record_of((scope, key, state, fence, p["fingerprint"], p["arg_hashes"], result, 1,
                                             None, p["task_id"], p["operation"], False, False, retention, fence))
        return True


def _unneeded(name: str, member: Any) -> Any:
    def verb(self: NoIOStore, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the no-I/O stand-in store does not implement {name}: the benchmark's calls "
                                  "should not need it")

    return verb


_complete(NoIOStore, _unneeded)


@dataclass
class Observed:
    """What guarded calls asked of their store, path by path, and the parameters of a first call's verbs."""

    verbs: dict[str, list[str]]  # "first call", "replay" (first of its task), "replay after a replay", "cached replay"
    claim: dict[str, Any]
    complete: dict[str, Any]


async def observe(url: str, store_kw: dict[str, Any]) -> Observed:
    """Two first calls of one task; then, by a guard that has not seen them, both replayed and the first
    replayed again (from its cache), each through a :class:`Recording` of a real store."""
    log: list[list[tuple[str, dict[str, Any]]]] = [[]]
    paths: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    tid = f"observe-{run_id()}"
    for calls in ((("first call", "o-1"), ("", "o-2")),
                  (("replay", "o-1"), ("replay after a replay", "o-2"), ("cached replay", "o-1"))):
        g = Guard(store=Recording(SQLStore(url, **store_kw), log))  # type: ignore[arg-type]
        tool = guarded(g, Body())
        try:
            with task(tid):
                for path, order in calls:
                    log.append([])
                    await tool(order, AMOUNT)
                    paths[path] = log[-1]
                log.append([])
        finally:
            await g.aclose()
    first = dict(paths["first call"])
    if set(first) != {"claim", "complete"}:
        raise SystemExit(f"benchmarks: a first call asked its store for {list(first)}, not claim + complete")
    # (a claim asked as likely taken — a replaying task's — is read first by the store: named so)
    verbs = {p: [f"{v} (likely taken)" if v == "claim" and a.get("likely_taken") else v for v, a in calls]
             for p, calls in paths.items() if p}
    return Observed(verbs, first["claim"], first["complete"])


# -- the raw drivers ------------------------------------------------------------------------------------------

def claim_params(obs: Observed, key: str, order: str, fence: int) -> dict[str, Any]:
    """The parameters a guarded first call passed to its store's claim, for another key, order and fence, and an
    owner token of its own, as each of the guard's claims has."""
    p = obs.claim
    return {**p, "key": key, "fence": fence, "owner": new_owner(),
            "operation": p["operation"].replace('"o-1"', f'"{order}"')}


class Raw:
    """A plain driver running the store's own statements (``SQLStore.sql``), autocommit each, with the
    parameters a guarded call passed to its store (``obs``): only the key, fence and order vary."""

    def __init__(self, label: str, url: str, obs: Observed, fetch: Callable[[str, dict[str, Any]], Awaitable[Any]],
                 close: Callable[[], Awaitable[Any]]) -> None:
        sql = SQLStore(url).sql
        self.label, self.obs, self.fetch, self.close = label, obs, fetch, close
        self.claim_sql, self.complete_sql, self.read_sql = (str(s.text) for s in (sql.claim, sql.complete, sql.read))

    def claim_params(self, key: str, order: str, fence: int) -> dict[str, Any]:
        return claim_params(self.obs, key, order, fence)

    async def first(self, key: str, order: str, result: str) -> None:
        """Claim, then complete: what a first call asks."""
        fence = secrets.randbits(62)
        await self.fetch(self.claim_sql, self.claim_params(key, order, fence))
        await self.fetch(self.complete_sql, {**self.obs.complete, "key": key, "fence": fence, "result": result})

    async def read(self, key: str) -> Any:
        rows = await self.fetch(self.read_sql, {"scope": self.obs.claim["scope"], "key": key})
        return rows[0]
