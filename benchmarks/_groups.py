"""The groups of variants measured side by side.

:func:`calls` times whole public operations: the raw driver running the store's own statements (the floors),
the store alone (``SQLStore``'s verbs, no ``Guard``), and guarded calls: first calls, replays that miss the
in-process cache (the calls of one task, as a resumed agent replays its history, and each the first of its
task), and replays served from the cache. With a no-I/O stand-in store and no raw driver it measures the
guard's own Python work; with many callers, first calls only. :func:`shortcuts` times each pure shortcut
whose docstring names the general path it equals, beside that general path.
"""

from __future__ import annotations

import inspect
import json
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from agentguard import Guard, task
from agentguard._calls import Replay
from agentguard._drive import run as drive_plan
from agentguard.stores import Record, Store

from ._common import AMOUNT, Body, Raw, fake_key, guarded, guarded_sync, run_id
from ._harness import SLICES, Call, Prepare, Stat, Variant, run_group

Log = Callable[[str], None]
CACHED = 64  # calls a cached replay cycles through: well inside any cache size


async def calls(
    new_store: Callable[[], Store], raw: Raw | None, *, n: int, reps: int, warmup: int, callers: int = 1, log: Log,
    profile: Sequence[str] = (), peers: Sequence[tuple[Variant, Body]] = (), sync_raw: Raw | None = None,
    slices: int = SLICES,
) -> tuple[dict[str, Stat], list[str]]:
    """``peers``: another library's first call and replay (with their bodies), measured beside ours. ``sync_raw``:
    a driver on the caller's thread, the floor of a sync tool's first call and replay, measured beside them.
    ``slices``: one caller's calls of a rep in that many slices, the variants taken in turn in each."""
    rid, orders = run_id(), [f"o-{i}" for i in range(max(n, warmup, CACHED))]
    keys: dict[str, list[str]] = {}
    tids: dict[str, str] = {}
    bodies: dict[str, Body] = {v.name: body for v, body in peers}
    closers: list[Callable[[], Awaitable[Any]]] = [r.close for r in (raw, sync_raw) if r is not None]

    def fresh(tag: str) -> Prepare:
        async def prepare(rep: int, k: int) -> None:
            keys[tag] = [fake_key(rid, tag, rep, i) for i in range(k)]
            tids[tag] = f"bench-{rid}-{tag}-{rep}"

        return prepare

    def guard(name: str, tag: str, prepare: Prepare | None = None, each: bool = False, ref: str = "",
              ledger: bool = True, sync: bool = False) -> Variant:
        """A guarded tool on a guard of its own (its cache has seen nothing) over a store of its own, called
        in the rep's task (``each``: a task per call; ``ledger=False``: a guard that keeps no ledger; ``sync``: a
        sync tool, its statements in the caller's thread)."""
        closers.append((g := Guard(store=new_store(), ledger=ledger)).aclose)
        flushes[tag, each] = g.flush_ledger
        body = bodies.setdefault(name, Body())
        tool, sync_tool = guarded(g, body), guarded_sync(g, body)

        async def call(i: int) -> None:
            with task(f"{tids[tag]}-{i}" if each else tids[tag]):
                if sync:
                    sync_tool(orders[i % len(keys[tag])], AMOUNT)
                else:
                    await tool(orders[i % len(keys[tag])], AMOUNT)

        return Variant(name, call, prepare or fresh(tag), ref)

    # A guard's ledger flush, by its variant's (tag, each): a filler's entries are written before the timed slices
    # (untimed), not by its writer in the middle of whichever variant's slice runs 0.2 s later.
    flushes: dict[tuple[str, bool], Callable[[], Awaitable[None]]] = {}
    pop = {each: guard("", "pop", each=each) for each in (False, True)}  # completes what replays replay

    def replayed(tag: str, each: bool = False) -> Prepare:
        async def prepare(rep: int, k: int) -> None:
            await fresh(tag)(rep, k)
            tids["pop"], keys["pop"] = tids[tag], keys[tag]
            for i in range(k):
                await pop[each].call(i)
            await flushes["pop", each]()

        return prepare

    async def fill_cache(rep: int, k: int) -> None:
        if rep == -1:  # complete the calls once; every later call replays one of them from the cache
            await fresh("cached")(rep, CACHED)
            for i in range(CACHED):
                await cached.call(i)
            await flushes["cached", False]()
            bodies[cached.name].runs = 0

    def machine_alone(name: str, tag: str, ref: str) -> Variant:
        """A replay by the state machine alone: the claim plan driven on the loop as the async driver drives it,
        the replay decoded, for calls whose identity was derived before the slices (untimed). Between the store's
        verb and the whole call: what a replay costs beyond the machine is the decorator's (binding, the identity),
        the driver's and the observer's (the note, the ledger's entry)."""
        closers.append((g := Guard(store=new_store(), ledger=False)).aclose)
        spec = guarded(g, Body()).__agentguard__  # type: ignore[attr-defined]
        machine = spec.machine
        made: list[Any] = []  # the rep's calls, their identity derived

        async def prepare(rep: int, k: int) -> None:
            await replayed(tag)(rep, k)
            with task(tids[tag]):
                made[:] = [spec.call((orders[i], AMOUNT), {})[0] for i in range(k)]

        async def call(i: int) -> None:
            outcome = await drive_plan(machine, machine.begin(made[i % len(made)]))
            if not isinstance(outcome, Replay):
                raise AssertionError(f"the state machine did not replay a completed call: {outcome!r}")
            outcome.result()

        return Variant(name, call, prepare, ref)

    plain = Body()

    async def unguarded(i: int) -> None:
        await plain(orders[i], AMOUNT, "ag_" + "0" * 48)

    firsts: list[Variant] = []
    replays: list[Variant] = []
    first_ref = replay_ref = ""
    if raw is not None:
        closers.append((store := new_store()).dispose)
        first_ref, replay_ref = f"raw {raw.label}: claim + complete", f"raw {raw.label}: SELECT"
        firsts, replays = _floors(raw, store, keys, orders, fresh, first_ref, replay_ref)
    variants = [*[Variant("unguarded call", unguarded)] * (callers == 1), *firsts,
                guard("agentguard: first call", "first", ref=first_ref)]
    if callers == 1 and raw is not None:  # what the ledger's entry costs a call, beside the call that writes it
        variants += [guard("agentguard, no ledger: first call", "nlfirst", ref=first_ref, ledger=False),
                     guard("agentguard, no ledger: replay", "nlreplay", replayed("nlreplay"), ref=replay_ref,
                           ledger=False)]
    if callers == 1 and sync_raw is not None:  # a sync tool beside the driver on its thread
        sync_first, sync_replay = f"raw {sync_raw.label}: claim + complete", f"raw {sync_raw.label}: SELECT"
        variants += [*_driver_floors(sync_raw, keys, orders, fresh, sync_first, sync_replay, "p"),
                     guard("agentguard: sync tool, first call", "sfirst", ref=sync_first, sync=True),
                     guard("agentguard: sync tool, replay", "sreplay", replayed("sreplay"), ref=sync_replay,
                           sync=True)]
    if callers == 1:
        cached = guard("agentguard: cached replay", "cached", fill_cache, ref=replay_ref)
        variants += [*replays, machine_alone("agentguard, the state machine alone: replay", "mreplay", replay_ref),
                     guard("agentguard: replay", "replay", replayed("replay"), ref=replay_ref),
                     guard("agentguard: replay, first of its task", "lone", replayed("lone", True), True, replay_ref),
                     cached, *(replace(v, ref=first_ref if v.name.endswith("first call") else replay_ref)
                               for v, _ in peers)]
    try:
        stats = await run_group(variants, n=n, reps=reps, warmup=warmup, callers=callers, slices=slices, log=log,
                                profile=profile)
    finally:
        for close in closers:
            await close()
    notes = [f"{callers} callers; the raw pool and the store's pools hold {callers} connections"] * (callers > 1)
    for name, body in bodies.items():  # the guarantee, checked on the benchmark's own calls
        want = warmup + n * reps if name.endswith("first call") else 0
        if name in stats and stats[name].ok and body.runs != want:
            notes.append(f"INVALID: {name} ran its body {body.runs} times, expected {want}")
    return stats, notes


def _driver_floors(raw: Raw, keys: dict[str, list[str]], orders: list[str], fresh: Callable[[str], Prepare],
                   first_ref: str, replay_ref: str, tag: str) -> list[Variant]:
    """The raw driver's claim + complete and its SELECT of a completed record (the floors of a first call and a
    replay; ``tag``: its keys')."""
    body = Body()

    async def result(i: int, key: str) -> str:
        return json.dumps(await body(orders[i], AMOUNT, key))  # what a first call stores

    async def completed(rep: int, k: int) -> None:
        await fresh(f"{tag}sel")(rep, k)
        for i, key in enumerate(keys[f"{tag}sel"]):
            await raw.first(key, orders[i], await result(i, key))

    async def first(i: int) -> None:
        key = keys[f"{tag}raw"][i]
        await raw.first(key, orders[i], await result(i, key))

    async def select(i: int) -> None:
        json.loads((await raw.read(keys[f"{tag}sel"][i]))["result"])

    return [Variant(first_ref, first, fresh(f"{tag}raw"), first_ref),
            Variant(replay_ref, select, completed, replay_ref)]


def _floors(
    raw: Raw, store: Store, keys: dict[str, list[str]], orders: list[str], fresh: Callable[[str], Prepare],
    first_ref: str, replay_ref: str,
) -> tuple[list[Variant], list[Variant]]:
    """The raw driver's floors (:func:`_driver_floors`), and the store alone (its claim of a completed key by each
    plan: ``_claims``): first-call and replay variants."""
    scope, done, body = raw.obs.claim["scope"], raw.obs.complete, Body()
    floor_first, floor_select = _driver_floors(raw, keys, orders, fresh, first_ref, replay_ref, "")

    async def result(i: int, key: str) -> str:
        return json.dumps(await body(orders[i], AMOUNT, key))  # what a first call stores

    def completed(tag: str) -> Prepare:
        async def prepare(rep: int, k: int) -> None:
            await fresh(tag)(rep, k)
            for i, key in enumerate(keys[tag]):
                await raw.first(key, orders[i], await result(i, key))

        return prepare

    async def claim_miss_select(i: int) -> None:
        if await raw.fetch(raw.claim_sql, raw.claim_params(keys["miss"][i], orders[i], 1)):
            raise AssertionError("a claim-miss claimed")
        json.loads((await raw.read(keys["miss"][i]))["result"])

    async def store_first(i: int) -> None:
        key = keys["store"][i]
        value = await result(i, key)
        fence = await store.claim(raw.claim_params(key, orders[i], secrets.randbits(62)))
        if not isinstance(fence, int):
            raise AssertionError(f"the store did not claim a fresh key: its claim answered {fence!r}")
        if not await store.complete(scope, key, fence, done["state"], value, done["retention"]):
            raise AssertionError(f"the store did not complete a fresh key it claimed (fence {fence})")

    async def store_read(i: int) -> None:
        rec = await store.read(scope, keys["sread"][i])
        json.loads(rec.result)  # type: ignore[union-attr,arg-type]

    def store_claim_hit(tag: str, likely_taken: bool) -> Call:
        async def call(i: int) -> None:
            got = await store.claim(raw.claim_params(keys[tag][i], orders[i], 1), likely_taken)
            if not isinstance(got, Record):
                raise AssertionError("the store's claim of a completed key did not return its record")

        return call

    V, label = Variant, f"raw {raw.label}"
    firsts = [floor_first, V("store only (SQLStore): claim + complete", store_first, fresh("store"), first_ref)]
    replays = [floor_select,
               V(f"{label}: claim-miss + SELECT", claim_miss_select, completed("miss"), replay_ref),
               V("store only (SQLStore): SELECT", store_read, completed("sread"), replay_ref),
               V("store only (SQLStore): claim, existing key", store_claim_hit("shit", False), completed("shit"),
                 replay_ref),
               V("store only (SQLStore): claim likely taken, existing key", store_claim_hit("thit", True),
                 completed("thit"), replay_ref)]
    return firsts, replays


async def shortcuts(*, n: int, reps: int, warmup: int, log: Log) -> tuple[dict[str, Stat], list[str]]:
    """Each pure shortcut on a call's path beside the general path its docstring says it equals (the floor of
    its row), on arguments not seen before (the flat identity keeps a memo of the ones it has seen)."""
    try:
        from agentguard._binder import Binder
        from agentguard._codec import Codec
        from agentguard._keys import argument_hashes, derive_key, fingerprint, hashes_json, operation_name
        from agentguard._keys_flat import FlatSignature

        binder = Binder(inspect.Signature([inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                           for p in ("order_id", "amount_cents")]))
        flat, codec = FlatSignature("charge", ["order_id", "amount_cents"], ["order_id"]), Codec(dict[str, Any])
    except (ImportError, AttributeError, TypeError) as exc:
        return {"shortcuts": Stat("shortcuts", unavailable=f"the shortcuts moved: {exc!r}")}, []
    value, rid = await Body()("o-1", AMOUNT, "ag_" + "1" * 48), run_id()
    args: list[dict[str, Any]] = []

    async def fresh(rep: int, k: int) -> None:
        args[:] = [{"order_id": f"p-{rid}-{rep}-{i}", "amount_cents": AMOUNT} for i in range(k)]

    def timed(fn: Callable[[dict[str, Any]], object]) -> Call:
        async def call(i: int) -> None:
            fn(args[i])

        return call

    pairs: list[tuple[str, Callable[[dict[str, Any]], object], str, Callable[[dict[str, Any]], object]]] = [
        ("binding: Binder.bind", lambda a: binder.bind((a["order_id"], AMOUNT), {}),
         "binding: Signature.bind + apply_defaults", lambda a: binder.general((a["order_id"], AMOUNT), {})),
        ("identity: FlatSignature (_keys_flat)", lambda a: flat.identity("default", "t", flat.values(a) or []),
         "identity: fingerprint + operation_name + derive_key + hashes_json (_keys)",
         lambda a: (fingerprint(a), derive_key("default", "t", operation_name("charge", {"order_id": a["order_id"]})),
                    hashes_json(argument_hashes(a)))),
        ("codec: Codec.store", lambda a: codec.store(value), "codec: encode, then decode",
         lambda a: codec.decode(codec.encode(value))),
    ]
    variants = [v for short, fast, general, slow in pairs
                for v in (Variant(f"{general} (general path)", timed(slow), fresh),
                          Variant(f"{short} (shortcut)", timed(fast), fresh, f"{general} (general path)"))]
    return await run_group(variants, n=n, reps=reps, warmup=warmup, log=log), []
