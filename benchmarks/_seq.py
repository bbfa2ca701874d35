"""One caller, either backend: the variants side by side.

First-call group: unguarded call; the raw drivers doing the store's own claim + complete; the store alone
(``SQLStore`` as the guard drives it, without the Guard); agentguard. Replay group: the raw drivers' SELECT
of the record (the floor) and claim-miss + SELECT; the store's SELECT alone; agentguard replays that miss any
in-process cache (Guard instances that have not seen the keys), both as the calls of one task (a resumed
agent replaying its history) and each in a task of its own; a replay served from the cache.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentguard import Guard, task

from . import _common as c
from ._harness import Stat, Variant, run_group

Log = Callable[[str], None]


class Raw(Protocol):
    """A plain driver executing the store's statements with named parameters, autocommit each."""

    label: str

    async def claim(self, p: dict[str, Any]) -> Any: ...  # our fence, or None on a conflict

    async def complete(self, p: dict[str, Any]) -> Any: ...

    async def read(self, p: dict[str, Any]) -> Any: ...  # the row; row["result"] is the stored text

    async def close(self) -> None: ...


def check_runs(stats: dict[str, Stat], notes: list[str], body: c.Body, name: str, expected: int) -> None:
    """The guarantee, checked on the benchmark's own calls: a first call runs the body, a replay never."""
    if name in stats and not stats[name].unavailable and body.runs != expected:
        notes.append(f"INVALID: {name} ran its body {body.runs} times, expected {expected}")
        stats[name].note = (stats[name].note + " INVALID").strip()


async def sequential(
    url: str,
    raws: list[Raw],
    *,
    rp: c.RawParams,
    guard_kw: dict[str, Any],
    forget: Callable[[str], Awaitable[None]],
    n: int,
    reps: int,
    warmup: int,
    log: Log,
) -> tuple[dict[str, Stat], list[str]]:
    from agentguard.stores import SQLStore

    floor = raws[0]
    notes: list[str] = []
    rid = c.run_id()
    closers: list[Callable[[], Awaitable[None]]] = [r.close for r in raws]

    def guard(**kw: Any) -> Guard:
        g = Guard(url, **guard_kw, **kw)
        closers.append(g.aclose)
        return g

    orders = [f"o-{i}" for i in range(max(n, warmup))]
    keys: dict[str, list[str]] = {}
    tids: dict[str, str] = {}

    def fresh(tag: str) -> Callable[[int, int], Awaitable[None]]:
        async def prepare(rep: int, k: int) -> None:
            keys[tag] = [c.fake_key(rid, tag, rep, i) for i in range(k)]
            tids[tag] = f"bench-{rid}-{tag}-{rep}"

        return prepare

    filler = c.Body()

    def populated(tag: str) -> Callable[[int, int], Awaitable[None]]:
        """Completed rows for the raw and store-only replay variants, each holding the result the tool
        returns (what a guard's replay reads and decodes), as a raw first call would have stored it."""

        async def prepare(rep: int, k: int) -> None:
            keys[tag] = ks = [c.fake_key(rid, tag, rep, i) for i in range(k)]
            for i, key in enumerate(ks):
                fence = secrets.randbits(62)
                value = await filler(orders[i], c.AMOUNT, key)
                await floor.claim(rp.claim(key, orders[i], fence))
                await floor.complete(rp.complete(key, fence, json.dumps(value)))

        return prepare

    plain = c.Body()

    async def unguarded(i: int) -> None:
        await plain(orders[i], c.AMOUNT, "ag_" + "0" * 48)

    raw_body = c.Body()

    def raw_first(raw: Raw, tag: str) -> Callable[[int], Awaitable[None]]:
        async def call(i: int) -> None:
            key = keys[tag][i]
            value = await raw_body(orders[i], c.AMOUNT, key)
            fence = secrets.randbits(62)
            await raw.claim(rp.claim(key, orders[i], fence))
            await raw.complete(rp.complete(key, fence, json.dumps(value)))

        return call

    def raw_select(raw: Raw, tag: str) -> Callable[[int], Awaitable[None]]:
        async def call(i: int) -> None:
            row = await raw.read({"scope": c.SCOPE, "key": keys[tag][i]})
            json.loads(row["result"])

        return call

    async def raw_miss_select(i: int) -> None:
        key = keys["rmiss"][i]
        if await floor.claim(rp.claim(key, orders[i], 1)) is not None:
            raise AssertionError("claim-miss claimed")
        row = await floor.read({"scope": c.SCOPE, "key": key})
        json.loads(row["result"])

    store = SQLStore(url, **{k: v for k, v in guard_kw.items() if k == "sqlite_synchronous"})
    closers.append(store.dispose)

    async def store_first(i: int) -> None:
        key = keys["store"][i]
        value = await raw_body(orders[i], c.AMOUNT, key)
        fence = await store.claim(rp.claim(key, orders[i], secrets.randbits(62)))
        if not isinstance(fence, int):
            raise AssertionError("store claim missed a fresh key")
        await store.complete(c.SCOPE, key, fence, "succeeded", json.dumps(value), c.RETENTION)

    async def store_read(i: int) -> None:
        rec = await store.read(c.SCOPE, keys["ssel"][i])
        if rec is None or rec.result is None:
            raise AssertionError("store read found no result")
        json.loads(rec.result)

    async def store_claim_hit(i: int) -> None:
        got = await store.claim(rp.claim(keys["shit"][i], orders[i], 1))
        if isinstance(got, int) or got is None:
            raise AssertionError("store claim of a completed key did not return its record")

    first_body = c.Body()
    first_tool = c.guarded(guard(), first_body)

    async def guard_first(i: int) -> None:
        with task(tids["first"]):
            await first_tool(orders[i], c.AMOUNT)

    pop_tool = c.guarded(guard(), c.Body())
    replay_body = c.Body()
    replay_tool = c.guarded(guard(), replay_body)  # another instance: a cache in it has not seen the keys

    async def replay_prepare(rep: int, k: int) -> None:
        tids["replay"] = tid = f"bench-{rid}-replay-{rep}"
        with task(tid):
            for i in range(k):
                await pop_tool(orders[i], c.AMOUNT)

    async def guard_replay(i: int) -> None:
        with task(tids["replay"]):
            await replay_tool(orders[i], c.AMOUNT)

    lone_body = c.Body()
    lone_tool = c.guarded(guard(), lone_body)  # another instance again: it has seen no key and no task

    async def lone_prepare(rep: int, k: int) -> None:
        tids["lone"] = tid = f"bench-{rid}-lone-{rep}"
        for i in range(k):
            with task(f"{tid}-{i}"):
                await pop_tool(orders[i], c.AMOUNT)

    async def guard_lone_replay(i: int) -> None:
        with task(f"{tids['lone']}-{i}"):
            await lone_tool(orders[i], c.AMOUNT)

    cache_body = c.Body()
    cache_guard = guard(**c.cache_kwargs())
    cache_tool = c.guarded(cache_guard, cache_body)
    cached_orders = [f"c-{i}" for i in range(64)]  # well inside any sensible cache size
    cache_tid = f"bench-{rid}-cached"

    async def cached_prepare(rep: int, k: int) -> None:
        if rep != -1:
            return
        await c.require_cache(cache_guard, cache_tool, cache_body, forget)
        with task(cache_tid):
            for _ in range(2):  # complete, then replay once: cached whichever way the cache is filled
                for o in cached_orders:
                    await cache_tool(o, c.AMOUNT)
        cache_body.runs = 0

    async def guard_cached(i: int) -> None:
        with task(cache_tid):
            await cache_tool(cached_orders[i % len(cached_orders)], c.AMOUNT)

    ck = c.cache_kwargs()
    if ck:
        notes.append(f"cache switched on with Guard({', '.join(f'{k}={v!r}' for k, v in ck.items())})")

    first_ref = f"raw {floor.label}: claim + complete"
    replay_ref = f"raw {floor.label}: SELECT"
    variants = [Variant("unguarded call", unguarded, note="the tool body alone")]
    for j, raw in enumerate(raws):
        variants.append(Variant(f"raw {raw.label}: claim + complete", raw_first(raw, f"raw{j}"), fresh(f"raw{j}"),
                                "the floor (2 statements)" if raw is floor else "reference", ref=first_ref))
    cof = getattr(floor, "claim_or_fetch", None)
    if cof is not None:

        async def raw_cof_first(i: int) -> None:
            key = keys["cof"][i]
            value = await raw_body(orders[i], c.AMOUNT, key)
            fence = secrets.randbits(62)
            await cof(rp.claim(key, orders[i], fence))
            await floor.complete(rp.complete(key, fence, json.dumps(value)))

        async def raw_cof_hit(i: int) -> None:
            row = await cof(rp.claim(keys["cofhit"][i], orders[i], 1))
            json.loads(row[5])  # (claimed, fence, state, fingerprint, arg_hashes, result, ...)

        variants.append(Variant(f"raw {floor.label}: read-or-claim + complete", raw_cof_first, fresh("cof"),
                                "the store's 1-RTT claim statement", ref=first_ref))
    variants += [
        Variant("store only (SQLStore): claim + complete", store_first, fresh("store"),
                "the guard's statements via SQLStore, no Guard", ref=first_ref),
        Variant("agentguard: first call", guard_first, fresh("first"), ref=first_ref),
    ]
    for j, raw in enumerate(raws):
        variants.append(Variant(f"raw {raw.label}: SELECT", raw_select(raw, f"rsel{j}"), populated(f"rsel{j}"),
                                "the replay floor (1 statement)" if raw is floor else "reference", ref=replay_ref))
    variants.append(Variant(f"raw {floor.label}: claim-miss + SELECT", raw_miss_select, populated("rmiss"),
                            "2 statements", ref=replay_ref))
    if cof is not None:
        variants.append(Variant(f"raw {floor.label}: read-or-claim, hit", raw_cof_hit, populated("cofhit"),
                                "1 statement", ref=replay_ref))
    variants += [
        Variant("store only (SQLStore): SELECT", store_read, populated("ssel"), ref=replay_ref),
        Variant("store only (SQLStore): claim, existing key", store_claim_hit, populated("shit"),
                "what a guard replay asks of the store", ref=replay_ref),
        Variant("agentguard: replay", guard_replay, replay_prepare,
                "misses the in-process cache; the calls of one task, as a resumed agent replays", ref=replay_ref),
        Variant("agentguard: replay, first of its task", guard_lone_replay, lone_prepare,
                "misses the cache; every call in its own task", ref=replay_ref),
        Variant("agentguard: cached replay", guard_cached, cached_prepare, ref=replay_ref),
    ]
    try:
        stats = await run_group(variants, n=n, reps=reps, warmup=warmup, log=log)
    finally:
        for close in reversed(closers):
            await close()
    check_runs(stats, notes, first_body, "agentguard: first call", warmup + n * reps)
    check_runs(stats, notes, replay_body, "agentguard: replay", 0)
    check_runs(stats, notes, lone_body, "agentguard: replay, first of its task", 0)
    check_runs(stats, notes, cache_body, "agentguard: cached replay", 0)
    return stats, notes
