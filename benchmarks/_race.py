"""The embedded peer race: agentguard against agent-once 0.1.0, side by side, interleaved, cache off.

agent-once runs its two statements through the stdlib ``sqlite3`` (one connection per thread) or one psycopg
connection, with no thread hop. Each rep makes ``n`` first calls (new keys) and then replays them, for a sync
and an async tool of each library, in an order rotated every rep; a ratio (agentguard ÷ agent-once, the sync
tool against agent-once's sync tool, the async against its async, and the async against its sync, its faster)
is taken in each rep and the median over reps kept. agentguard's in-process cache is off (``cache_size=0``), so
each replay reads the store, as each of agent-once's does. SQLite runs at ``synchronous=FULL`` and ``NORMAL``
(both libraries at the same level, WAL mode both), Postgres at the database's settings.

On SQLite every store is first grown past its WAL file's growth (:func:`race_one`'s ``grow``): by its sync tool, in
chunks of ``GROW_CHUNK`` first calls back to back, agentguard's and the floor's until the file holds the frames at
which their checkpoint threads restart it (``_direct.WAL_RESTART_FRAMES``), agent-once's until a chunk leaves it
the size it was. At ``FULL`` a synced commit that lands past a WAL file's end costs about twice one that overwrites
frames already in it (the file system journals the file's new size with the sync), and the stores keep WALs of
different sizes: agent-once SQLite's default of 1,000 pages, checkpointed by the committing call; agentguard and the
floor up to 16,000 frames, checkpointed on a thread of their own, which under back-to-back writes do not catch up
before then. On fresh files the reps timed each store at a different point of its growth, the per-rep ratios of
one run on either side of 1.0 (agentguard's sync tool's first call 0.60–1.54× agent-once's). The reps time
stores past it, as a worker's are after its first few thousand calls; each store's first ``FRESH`` calls of its
growth are timed too and printed beside them (``fresh store``), not held to a target.

On SQLite a third runner goes in the same rotation: the floor, the store's own claim and completion statements
(and its read, for a replay) run by stdlib ``sqlite3`` on the caller's thread, autocommit, at the same level, on
a file of its own (``_drivers.sqlite3_raw``), the result encoded and decoded as a guarded call's is. Each of
agentguard's tools is also taken against it: a first call at most 2.0× the floor, a replay at most 1.5×.

``python -m benchmarks --race`` runs it alone; a full run with peers runs it too.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from agentguard import Guard, task
from agentguard.stores._direct import WAL_RESTART_FRAMES

from ._common import observe, run_id
from ._drivers import sqlite3_raw

KINDS = ("first call", "replay")
TOOLS = ("sync", "async")
FLOOR = "stdlib sqlite3"
# agentguard ÷ the floor, at most (issue 34): a first call, a replay
FLOOR_LIMITS = {"first call": 2.0, "replay": 1.5}
RESULT = {"charge_id": "ch_1", "amount_cents": 1999, "currency": "usd"}
GROW_CHUNK, GROW_MAX = 500, 30  # first calls in each chunk of a store's growth, and at most so many chunks
FRESH = 2000  # a fresh store's first calls timed in its growth
RESTARTED_BYTES = 32 + WAL_RESTART_FRAMES * (4096 + 24)  # a WAL file of that many frames (its header, each frame's)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def available() -> str:
    """Why the race cannot run here, or ""."""
    return "" if importlib.util.find_spec("once") else "agent-once is not installed here (pip install agent-once)"


async def race_one(ag_url: str, once_target: str, *, synchronous: str | None, reps: int, n: int,
                   floor_path: Path | None = None, grow: bool = False) -> dict[str, Any]:
    """One backend: µs per call (medians) and the ratios, for first calls and replays, sync and async tools
    (``floor_path``: also against stdlib sqlite3 running the store's statements there). ``grow`` (SQLite): the
    stores first grown past their WAL files' growth, which is timed apart."""
    from once import Once

    once = Once(once_target)
    if synchronous is not None:  # agent-once sets WAL itself; the durability level is ours to match
        once.store._conn().execute(f"PRAGMA synchronous = {synchronous}")  # type: ignore[attr-defined]
    kw: dict[str, Any] = {"sqlite_synchronous": synchronous} if synchronous else {}
    runs = {"agentguard": 0, "agent-once": 0}
    floor = None
    if floor_path is not None:
        floor_url = f"sqlite+aiosqlite:///{floor_path}"
        floor = await sqlite3_raw(floor_path, await observe(floor_url, kw), synchronous or "FULL")
    floored: set[str] = set()
    async with Guard(ag_url, cache_size=0, **kw) as guard:

        @guard.once(key=["order_id"], operation="charge_sync")
        def ag_sync(order_id: str) -> dict[str, Any]:
            runs["agentguard"] += 1
            return RESULT

        @guard.once(key=["order_id"], operation="charge_async")
        async def ag_async(order_id: str) -> dict[str, Any]:
            runs["agentguard"] += 1
            return RESULT

        @once.tool(name="charge_sync")
        def once_sync(order_id: str) -> dict[str, Any]:
            runs["agent-once"] += 1
            return RESULT

        @once.tool(name="charge_async")
        async def once_async(order_id: str) -> dict[str, Any]:
            runs["agent-once"] += 1
            return RESULT

        rid = run_id()

        def batch(lib: str, tool: str) -> Callable[[list[str]], Awaitable[None]]:
            scope = f"race-{rid}-{lib}-{tool}"
            if lib == FLOOR:
                assert floor is not None

                async def go(keys: list[str]) -> None:  # a first call the first time a key is seen, else a replay
                    for k in keys:
                        key = f"{scope}-{k}"
                        if key in floored:
                            json.loads((await floor.read(key))["result"])
                        else:
                            await floor.first(key, k, json.dumps(RESULT))
                            floored.add(key)
            elif lib == "agentguard" and tool == "sync":
                async def go(keys: list[str]) -> None:
                    with task(scope):
                        for k in keys:
                            ag_sync(k)
                    await guard.flush_ledger()  # its entries written in its own time, not in the next runner's
            elif lib == "agentguard":
                async def go(keys: list[str]) -> None:
                    with task(scope):
                        for k in keys:
                            await ag_async(k)
                    await guard.flush_ledger()
            elif tool == "sync":
                async def go(keys: list[str]) -> None:
                    with once.scope(scope):
                        for k in keys:
                            once_sync(k)
            else:
                async def go(keys: list[str]) -> None:
                    with once.scope(scope):
                        for k in keys:
                            await once_async(k)
            return go

        variants = [(lib, tool) for lib in ("agent-once", "agentguard") for tool in TOOLS]
        variants += [(FLOOR, "sync")] if floor is not None else []
        batches = {v: batch(*v) for v in variants}
        # Each store grown past its WAL file's growth by one of its runners, in chunks back to back: agentguard's and
        # the floor's until the file holds the frames at which their checkpoint threads restart it, agent-once's
        # until a chunk leaves it the size it was. Each runner's first FRESH calls in it timed (the fresh store).
        growers = [(("agentguard", "sync"), Path(f"{ag_url.split(':///', 1)[1]}-wal"), True),
                   (("agent-once", "sync"), Path(f"{once_target}-wal"), False)]
        growers += [((FLOOR, "sync"), Path(f"{floor_path}-wal"), True)] if floor_path is not None else []
        fresh: dict[str, float] = {}
        grown = {"agentguard": 0, "agent-once": 0}  # first calls each library's body ran in the growth
        for v, wal, restarted in growers if grow else ():
            spent = 0.0
            for chunk in range(GROW_MAX):
                size = _size(wal)
                t0 = time.perf_counter()
                await batches[v]([f"g-{chunk}-{i}" for i in range(GROW_CHUNK)])
                spent += time.perf_counter() - t0
                grown[v[0]] = grown.get(v[0], 0) + GROW_CHUNK
                if chunk + 1 == FRESH // GROW_CHUNK:
                    fresh[v[0]] = spent / FRESH * 1e6
                if chunk + 1 >= FRESH // GROW_CHUNK and (_size(wal) >= RESTARTED_BYTES if restarted
                                                         else _size(wal) == size):
                    break
            else:
                raise RuntimeError(f"{v[0]}'s WAL file still grew after {GROW_MAX * GROW_CHUNK} first calls")
        times: dict[tuple[str, str, str], list[float]] = {(*v, k): [] for v in variants for k in KINDS}
        for rep in range(-1, reps):  # rep -1: the warm-up, not kept
            keys = [f"o-{rep}-{i}" for i in range(n if rep >= 0 else 20)]
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for kind in KINDS:
                for v in order:
                    t0 = time.perf_counter()
                    await batches[v](keys)
                    if rep >= 0:
                        times[(*v, kind)].append((time.perf_counter() - t0) / len(keys) * 1e6)
    once.close()
    if floor is not None:
        await floor.close()
    expected = {lib: grown[lib] + 2 * (20 + n * reps) for lib in runs}  # a run per first call per tool, none per replay
    out: dict[str, Any] = {"valid": runs == expected, "runs": runs}
    if fresh:  # each store's first FRESH first calls, a sync tool's, on its fresh file (not held to a target)
        out["fresh store"] = {"calls": FRESH, "us": fresh, "grown": grown}
    for kind in KINDS:
        for tool, peer_tool in (*((t, t) for t in TOOLS), ("async", "sync")):
            ag, peer = times[("agentguard", tool, kind)], times[("agent-once", peer_tool, kind)]
            name = f"{kind}, {tool} tool" + ("" if tool == peer_tool else f" ÷ its {peer_tool} tool")
            out[name] = _ratio(ag, peer, "agent-once")
        for tool in TOOLS if floor is not None else ():
            out[f"{kind}, {tool} tool ÷ {FLOOR}"] = _ratio(times[("agentguard", tool, kind)],
                                                           times[(FLOOR, "sync", kind)], FLOOR)
    return out


def _ratio(ag: list[float], other: list[float], against: str) -> dict[str, Any]:
    """Medians of µs per call and of the per-rep ratios."""
    return {
        "agentguard_us": statistics.median(ag), "other_us": statistics.median(other), "against": against,
        "ratio": statistics.median(a / p for a, p in zip(ag, other, strict=True)),
        "ratios": [round(a / p, 3) for a, p in zip(ag, other, strict=True)],
    }


async def race_sqlite(doc: dict[str, Any], *, reps: int, n: int, log: Callable[[str], None], grow: bool = True) -> None:
    """The race on SQLite at FULL and at NORMAL, into ``doc`` (``grow``: the stores grown first, see the module)."""
    if _note(doc):
        return
    with tempfile.TemporaryDirectory(prefix="agentguard-race.") as tmp:
        for sync in ("FULL", "NORMAL"):
            log(f"== peer race: agent-once, SQLite synchronous={sync} ({n} calls × {reps} reps)")
            d = Path(tmp) / sync
            d.mkdir()
            doc[f"sqlite {sync}"] = await race_one(f"sqlite+aiosqlite:///{d / 'ag.db'}", str(d / "once.db"),
                                                   synchronous=sync, reps=reps, n=n, floor_path=d / "floor.db",
                                                   grow=grow)


async def race_postgres(doc: dict[str, Any], url: str, *, reps: int, n: int, log: Callable[[str], None]) -> None:
    """The race on the Postgres database ``url``, into ``doc``."""
    if _note(doc) or importlib.util.find_spec("psycopg") is None:
        doc.setdefault("postgres", {"unavailable": "psycopg (agent-once's Postgres driver) is not installed here"})
        return
    from ._drivers import dsn_of

    log(f"== peer race: agent-once, Postgres ({n} calls × {reps} reps)")
    doc["postgres"] = await race_one(url, dsn_of(url), synchronous=None, reps=reps, n=n)


def _note(doc: dict[str, Any]) -> bool:
    """Whether the race cannot run (said in ``doc``)."""
    why = available()
    if why:
        doc["unavailable"] = why
    else:
        doc.setdefault("agent_once", version("agent-once"))
    return bool(why)


def targets(doc: dict[str, Any]) -> list[tuple[str, str, float | None, str, float]]:
    """(id, what, ratio, why n/a, limit) for each row of the race: at most 1.0 against agent-once, and against
    the sqlite3 floor at most ``FLOOR_LIMITS``."""
    out: list[tuple[str, str, float | None, str, float]] = []
    for backend in ("sqlite FULL", "sqlite NORMAL", "postgres"):
        rows = doc.get(backend)
        if rows is None:
            continue
        name = backend.replace(" ", "_").lower()
        why = rows.get("unavailable", "") or ("" if rows.get("valid", True) else "INVALID: body runs")
        for kind in KINDS:
            for tool in TOOLS:
                r = rows.get(f"{kind}, {tool} tool")
                out.append((f"agent_once_{name}_{kind.split()[0]}_{tool}",
                            f"Peer: agentguard {tool} tool {kind} ÷ agent-once's ({backend})",
                            None if r is None or why else r["ratio"], why, 1.0))
            for tool in TOOLS if backend.startswith("sqlite") else ():
                r = rows.get(f"{kind}, {tool} tool ÷ {FLOOR}")
                out.append((f"floor_{name}_{kind.split()[0]}_{tool}",
                            f"Floor: agentguard {tool} tool {kind} ÷ {FLOOR} ({backend})",
                            None if r is None or why else r["ratio"], why, FLOOR_LIMITS[kind]))
    return out


def race_table(doc: dict[str, Any]) -> str:
    if "unavailable" in doc:
        return f"== Peer race (agent-once): n/a ({doc['unavailable']})"
    lines = [f"== Peer race: agentguard ÷ agent-once {doc['agent_once']}, and on SQLite ÷ {FLOOR} running the store's"
             " statements on the caller's thread (interleaved, cache off; µs/call medians; ratio = median of per-rep"
             " ratios, ≤ 1.0 against agent-once means agentguard is ahead)",
             f"{'backend':<16}{'call':<40}{'agentguard µs':>14}{'other µs':>10}{'ratio':>8}  per rep"]
    for backend, rows in doc.items():
        if not isinstance(rows, dict):
            continue
        if "unavailable" in rows:
            lines.append(f"{backend:<16}n/a ({rows['unavailable']})")
        for name, r in rows.items():
            if isinstance(r, dict) and "ratio" in r:
                lines.append(f"{backend:<16}{name:<40}{r['agentguard_us']:>14.0f}{r['other_us']:>10.0f}"
                             f"{r['ratio']:>7.2f}×  {' '.join(f'{x:.2f}' for x in r['ratios'])}")
        if "fresh store" in rows:
            us = rows["fresh store"]["us"]
            ag, peer, floor = us["agentguard"], us["agent-once"], us.get(FLOOR)
            lines.append(f"{backend:<16}{'fresh store: first call, sync tool':<40}{ag:>14.0f}{peer:>10.0f}"
                         f"{ag / peer:>7.2f}×  each store's first {rows['fresh store']['calls']} calls"
                         + (f" (÷ {FLOOR} {ag / floor:.2f}×, {floor:.0f} µs)" if floor else "")
                         + ", not a target")
        if not rows.get("valid", True):
            lines.append(f"{backend:<16}INVALID: body runs {rows.get('runs')}")
    return "\n".join(lines)

