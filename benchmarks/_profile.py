"""``python -m benchmarks --profile``: where a guarded call's time goes, per backend.

For an agentguard first call and a replay (cache miss) it reports, per call:
- wall time, CPU of the calling thread, CPU of the other threads (aiosqlite's worker runs SQLite there);
- counts from a cProfile run: statements executed through SQLAlchemy, pool checkouts, aiosqlite thread
  hops, event-loop iterations, tasks created, json.dumps calls;
- the calling thread's profiled CPU time split by layer (agentguard, SQLAlchemy, greenlet, asyncpg, aiosqlite,
  asyncio, pydantic, stdlib json/hashlib, ...), builtins charged to the layer that called them;
- the top functions by own time.
cProfile inflates pure-Python code more than C code: read the split as proportions, not microseconds.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from agentguard import Guard, task

from . import _common as c

_LAYERS = (
    ("/agentguard/", "agentguard"),
    ("/benchmarks/", "benchmark loop"),
    ("/sqlalchemy/", "SQLAlchemy"),
    ("/greenlet/", "greenlet"),
    ("/asyncpg/", "asyncpg"),
    ("/aiosqlite/", "aiosqlite"),
    ("/pydantic", "pydantic"),
    ("/asyncio/", "asyncio loop"),
    ("selectors.py", "asyncio loop"),
    ("/json/", "json"),
    ("threading.py", "threads (wake-ups)"),
    ("/queue.py", "threads (wake-ups)"),
    ("/concurrent/", "threads (wake-ups)"),
    ("/dataclasses.py", "dataclasses"),
    ("/inspect.py", "inspect (signature bind)"),
    ("/logging/", "logging"),
    ("secrets.py", "secrets/random"),
    ("random.py", "secrets/random"),
    ("/contextlib.py", "contextlib"),
    ("/typing.py", "typing"),
)


def _layer(filename: str) -> str:
    for needle, name in _LAYERS:
        if needle in filename:
            return name
    return "other"


def _split(st: pstats.Stats) -> dict[str, float]:
    """Own time by layer; a builtin's own time goes to its callers' layers in proportion."""
    out: dict[str, float] = defaultdict(float)
    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    for (filename, _line, _name), (_cc, _nc, tt, _ct, callers) in raw.items():
        if filename != "~":
            out[_layer(filename)] += tt
            continue
        total = sum(v[2] for v in callers.values()) or 1.0
        for (cf, _cl, _cn), v in callers.items():
            out[_layer(cf) if cf != "~" else "builtins"] += tt * v[2] / total
    return dict(out)


def _count(st: pstats.Stats, pred: Callable[[str, str], bool]) -> int:
    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    return sum(v[1] for (f, _l, n), v in raw.items() if pred(f, n))


def _builtin(name: str) -> Callable[[str, str], bool]:
    return lambda f, n: f == "~" and name in n


# Only plain functions: cProfile counts every resumption of a coroutine as a call.
_COUNTS: dict[str, Callable[[str, str], bool]] = {
    "statements via SQLAlchemy": lambda f, n: f.endswith("sqlalchemy/engine/base.py") and n == "_execute_context",
    "pool checkouts": lambda f, n: f.endswith("sqlalchemy/pool/base.py") and n == "_checkout",
    "pool check-ins": lambda f, n: f.endswith("sqlalchemy/pool/base.py") and n == "_reset",
    "aiosqlite thread hops": _builtin("'put_nowait' of '_queue.SimpleQueue'"),
    "socket sends": _builtin("'send' of '_socket.socket'"),
    "greenlet switches": _builtin("'switch' of 'greenlet.greenlet'"),
    "event-loop iterations": lambda f, n: f.endswith("asyncio/base_events.py") and n == "_run_once",
    "tasks created": lambda f, n: f.endswith("asyncio/base_events.py") and n == "create_task",
    "json.dumps": lambda f, n: f.endswith("json/__init__.py") and n == "dumps",
    "Signature.bind": lambda f, n: f.endswith("inspect.py") and n == "_bind",
}


async def _measure(call: Callable[[int], Awaitable[Any]], n: int) -> dict[str, float]:
    t0, c0, th0 = time.perf_counter(), time.process_time(), time.thread_time()
    for i in range(n):
        await call(i)
    wall, cpu, th = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - th0
    return {"wall_us": wall / n * 1e6, "main_thread_cpu_us": th / n * 1e6, "other_threads_cpu_us": (cpu - th) / n * 1e6}


async def _profiled(call: Callable[[int], Awaitable[Any]], n: int) -> pstats.Stats:
    pr = cProfile.Profile(time.thread_time)  # CPU of the calling thread: waiting for I/O is not "time" here
    pr.enable()
    for i in range(n):
        await call(i)
    pr.disable()
    return pstats.Stats(pr)


async def profile_backend(url: str, n: int, guard_kw: dict[str, Any]) -> dict[str, Any]:
    rid = c.run_id()
    guards: list[Guard] = []

    def tool() -> Callable[..., Awaitable[Any]]:
        g = Guard(url, **guard_kw)
        guards.append(g)
        return c.guarded(g, c.Body())

    first = tool()
    out: dict[str, Any] = {}
    try:
        async def warm(i: int) -> None:
            with task(f"prof-{rid}-warm"):
                await first(f"o-{i}", c.AMOUNT)

        await _measure(warm, 50)
        for kind in ("first call", "replay"):
            res: dict[str, Any] = {}
            for phase in ("timed", "profiled"):
                tid = f"prof-{rid}-{phase}"
                if kind == "first call":
                    target, task_id = first, tid + "-first"
                else:
                    populate = tool()
                    with task(tid + "-replay"):
                        for i in range(n):
                            await populate(f"o-{i}", c.AMOUNT)
                    target, task_id = tool(), tid + "-replay"  # a guard whose cache has not seen the keys

                def call(i: int, target: Any = target, task_id: str = task_id) -> Awaitable[Any]:
                    async def go() -> None:
                        with task(task_id):
                            await target(f"o-{i}", c.AMOUNT)

                    return go()

                if phase == "timed":
                    res.update({k: round(v, 1) for k, v in (await _measure(call, n)).items()})
                else:
                    st = await _profiled(call, n)
                    total = sum(_split(st).values())
                    res["counts_per_call"] = {k: round(_count(st, p) / n, 2) for k, p in _COUNTS.items()}
                    res["profiled_share"] = {k: round(v / total, 3) for k, v in
                                             sorted(_split(st).items(), key=lambda kv: -kv[1]) if v / total >= 0.005}
                    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
                    top = sorted(raw.items(), key=lambda kv: -kv[1][2])[:12]
                    res["top_own_time"] = [
                        {"function": f"{_short(f)}:{line}({name})", "calls_per_call": round(v[1] / n, 2),
                         "share": round(v[2] / total, 3)} for (f, line, name), v in top]
            out[kind] = res
    finally:
        for g in guards:
            await g.aclose()
    return out


def _short(path: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def render(backend: str, prof: dict[str, Any]) -> str:
    lines = [f"== Profile: {backend}"]
    for kind, res in prof.items():
        lines.append(f"-- agentguard {kind}: wall {res['wall_us']} µs/call, calling-thread CPU "
                     f"{res['main_thread_cpu_us']} µs, other threads {res['other_threads_cpu_us']} µs")
        lines.append("   per call: " + ", ".join(f"{k} {v:g}" for k, v in res["counts_per_call"].items()))
        shares = ", ".join(f"{k} {v:.0%}" for k, v in res["profiled_share"].items())
        lines.append(f"   calling-thread CPU by layer (profiled): {shares}")
        lines.append("   top functions by own CPU time:")
        for t in res["top_own_time"]:
            lines.append(f"     {t['share']:>5.1%}  ×{t['calls_per_call']:<5g} {t['function']}")
    return "\n".join(lines)
