"""What every backend's benchmark shares: the tool, the store's own statements and parameters, keys, and
the probe that tells whether this agentguard serves replays from an in-process cache."""

from __future__ import annotations

import hashlib
import inspect
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from agentguard import Guard, task

from ._harness import Unavailable

SCOPE = "default"
LEASE = 30.0
RETENTION = 7 * 86400.0
AMOUNT = 4900


@dataclass
class Body:
    """The money-moving tool: a trivial body (so the guard's cost shows), counting how often it ran."""

    runs: int = 0

    async def __call__(self, order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        self.runs += 1
        return {
            "charge_id": "ch_" + idempotency_key[3:27],
            "order_id": order_id,
            "amount_cents": amount_cents,
            "currency": "eur",
            "status": "succeeded",
        }


def guarded(guard: Guard, body: Body) -> Callable[..., Awaitable[dict[str, Any]]]:
    """``@guard.once(key=["order_id"])`` over a fresh function that calls ``body``: the public API only."""

    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        return await body(order_id, amount_cents, idempotency_key)

    return charge


def fake_key(*parts: object) -> str:
    """A key shaped like the guard's (``ag_`` + 48 hex digits), for the raw-driver variants."""
    return "ag_" + hashlib.sha256(repr(parts).encode()).hexdigest()[:48]


def run_id() -> str:
    return secrets.token_hex(4)


# -- the store's statements, executed by the raw drivers -----------------------------------------------


@dataclass
class Statements:
    claim: str
    complete: str
    read: str
    claim_or_fetch: str | None  # Postgres: claim, or fetch the existing record, in one round trip


def store_statements(url: str) -> Statements:
    """The exact statements a guarded call issues, taken from the store itself (``SQLStore.sql``), so the
    raw-driver floor keeps doing the same work when the store changes."""
    from agentguard.stores import SQLStore

    store = SQLStore(url)
    sql = store.sql
    cof = getattr(sql, "claim_or_fetch", None)
    try:
        return Statements(str(sql.claim.text), str(sql.complete.text), str(sql.read.text),
                          None if cof is None else str(cof.text))
    except AttributeError as exc:
        raise SystemExit(
            f"benchmarks: the store's statements moved ({exc}); update benchmarks/_common.store_statements"
        ) from None


_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def positional(sql: str) -> tuple[str, Callable[[dict[str, Any]], tuple[Any, ...]]]:
    """``:name`` placeholders to asyncpg's ``$n``; returns the SQL and a fast dict -> args getter."""
    names: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    out = _NAMED.sub(sub, sql)
    getter = itemgetter(*names)
    if len(names) == 1:
        return out, lambda p: (getter(p),)
    return out, getter


@dataclass
class RawParams:
    """The parameters of the claim and complete statements, copied from a real guarded call (see
    :func:`capture_params`) so the raw floor binds exactly what the guard binds; only the key, fence,
    task and operation vary per call."""

    claim_template: dict[str, Any]
    complete_template: dict[str, Any]

    def claim(self, key: str, order_id: str, fence: int) -> dict[str, Any]:
        p = dict(self.claim_template)
        p.update(key=key, fence=fence, task_id="bench-raw", operation=f'charge[order_id="{order_id}"]')
        return p

    def complete(self, key: str, fence: int, result: str) -> dict[str, Any]:
        p = dict(self.complete_template)
        p.update(key=key, fence=fence, result=result)
        return p


@dataclass
class Observed:
    """What one guarded first call and its replays (by a guard that has not seen the keys) sent to the store."""

    params: RawParams
    first: list[str]  # the statements, in order
    replay: list[str]  # the first replay of a task
    replay_next: list[str]  # a replay right after a replay in the same task (a resumed agent's history)


def _spy(g: Guard, logs: list[list[tuple[str, dict[str, Any]]]]) -> None:
    """Log each statement into ``logs[-1]`` (append a new list to start another call's log)."""
    store = getattr(g, "_store", None)
    one = getattr(store, "_one", None)
    if one is None:
        raise SystemExit("benchmarks: SQLStore._one is gone; update benchmarks/_common.observe")

    async def one_spy(what: str, stmt: Any, params: dict[str, Any], **kw: Any) -> Any:
        sql = " ".join(str(getattr(stmt, "text", stmt)).split())
        then = kw.get("then")
        if then is not None:  # SQLite: a read, and an insert only if it found nothing, in one thread hop
            sql += " ;THEN " + " ".join(str(getattr(then, "text", then)).split())
        logs[-1].append((sql, dict(params)))
        return await one(what, stmt, params, **kw)

    store._one = one_spy  # type: ignore[union-attr]


async def observe(url: str, **guard_kw: Any) -> Observed:
    """Run two guarded calls of one task, then replay both with another guard, with the store's statement
    executor observed: the raw floor then binds exactly the parameters the guard binds, and the report can
    list the statements of each path."""
    first: list[tuple[str, dict[str, Any]]] = []
    replay: list[tuple[str, dict[str, Any]]] = []
    replay_next: list[tuple[str, dict[str, Any]]] = []
    tid = f"observe-{run_id()}"

    async def two_calls(log1: list[tuple[str, dict[str, Any]]], log2: list[tuple[str, dict[str, Any]]]) -> None:
        """Two calls of the task by a new guard, each call's statements into its own log."""
        g = Guard(url, **guard_kw)
        current = [log1]
        _spy(g, current)
        try:
            tool = guarded(g, Body())
            with task(tid):
                await tool("o-observe", AMOUNT)
                current.append(log2)
                await tool("o-observe-2", AMOUNT)
        finally:
            await g.aclose()

    await two_calls(first, [])  # two first calls
    await two_calls(replay, replay_next)  # the first replay of the task, then the replay after it
    claim = next((p for _, p in first if "owner" in p and "fence" in p), None)
    complete = next((p for _, p in first if "result" in p), None)
    if claim is None or complete is None:
        raise SystemExit("benchmarks: could not recognise the claim/complete parameters; update "
                         "benchmarks/_common.observe")
    return Observed(RawParams(claim, complete), [s for s, _ in first], [s for s, _ in replay],
                    [s for s, _ in replay_next])


def verb(sql: str) -> str:
    """A short name for a statement: ``INSERT``, ``UPDATE``, ``SELECT``, ``WITH ... INSERT`` (claim-or-fetch)."""
    if " ;THEN INSERT" in sql:
        return "read-or-claim (SELECT, then INSERT only if absent: one thread hop)"
    if "_claim_v" in sql and sql.lstrip().upper().startswith("SELECT"):
        return "read-or-claim (a function: SELECT, then INSERT only if absent: one round trip)"
    words = sql.split()
    head = words[0].upper() if words else "?"
    if head == "WITH":
        return "claim-or-fetch (WITH INSERT ... UNION ALL SELECT)"
    return {"INSERT": "INSERT (claim)", "UPDATE": "UPDATE (complete)", "SELECT": "SELECT (read)"}.get(head, head)


# -- the in-process cache of completed records (another engineer is adding it) ------------------------


def cache_kwargs() -> dict[str, Any]:
    """Guard keyword arguments that switch the in-process replay cache on, if it is opt-in.

    Looks for a ``Guard(...)`` parameter whose name mentions a cache; a falsy default means opt-in.
    """
    kw: dict[str, Any] = {}
    for name, p in inspect.signature(Guard.__init__).parameters.items():
        if "cache" not in name.lower() or p.kind is not p.KEYWORD_ONLY:
            continue
        default = p.default
        if default is True or (isinstance(default, int) and not isinstance(default, bool) and default > 0):
            continue  # on by default
        kw[name] = True if isinstance(default, bool) else 10_000
    return kw


async def require_cache(
    guard: Guard, tool: Callable[..., Awaitable[Any]], body: Body, forget: Callable[[str], Awaitable[None]]
) -> None:
    """Raise Unavailable unless ``guard`` replays a completed call with its record gone from the store.

    Public behaviour only: complete a call, replay it once, delete its row behind the guard's back
    (``forget(task_id)``), call again. A guard with an in-process cache replays; one without runs the tool.
    """
    tid = f"cache-probe-{run_id()}"
    with task(tid):
        await tool("probe", AMOUNT)
        await tool("probe", AMOUNT)
    runs = body.runs
    await forget(tid)
    with task(tid):
        await tool("probe", AMOUNT)
    if body.runs != runs:
        body.runs = runs
        raise Unavailable("this agentguard has no in-process replay cache yet (a replay reads the store)")
