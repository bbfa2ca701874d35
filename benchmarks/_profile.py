"""``python -m benchmarks --profile``: where a guarded call's time goes. The run's own first-call and replay
variants run under cProfile (the calling thread's CPU: waiting for I/O is not counted), and each is reported
as counts per call, the CPU split by layer (a builtin charged to the layers that called it), and the top
functions by their own CPU time. cProfile inflates pure-Python code more than C code: read the split as
proportions, not microseconds (and the run's timings, which it slows, are not printed).
"""

from __future__ import annotations

import os
import pstats
from collections import defaultdict
from pathlib import Path
from typing import Any

from ._harness import Stat

PROFILED = ("agentguard: first call", "agentguard: replay")
_LAYERS = (("/agentguard/", "agentguard"), ("/benchmarks/", "benchmark loop"), ("/sqlalchemy/", "SQLAlchemy"),
           ("/greenlet/", "greenlet"), ("/asyncpg/", "asyncpg"), ("/aiosqlite/", "aiosqlite"),
           ("/pydantic", "pydantic"), ("/asyncio/", "asyncio loop"), ("selectors.py", "asyncio loop"),
           ("/json/", "json"), ("threading.py", "threads"), ("/queue.py", "threads"), ("/concurrent/", "threads"))
# Counted on plain functions only: cProfile counts every resumption of a coroutine as a call.
_COUNTS = {"round trips (socket sends)": ("~", "'send' of '_socket.socket'"),
           "aiosqlite thread hops": ("~", "'put_nowait' of '_queue.SimpleQueue'"),
           "greenlet switches": ("~", "'switch' of 'greenlet.greenlet'"),
           "event-loop iterations": ("asyncio/base_events.py", "_run_once"),
           "tasks created": ("asyncio/base_events.py", "create_task")}
_ROOTS = ("site-packages/", os.path.dirname(os.__file__) + "/", str(Path(__file__).parent.parent) + "/")


def _layer(filename: str) -> str:
    return next((name for needle, name in _LAYERS if needle in filename), "other")


def _short(path: str) -> str:
    return next((path.split(root, 1)[1] for root in _ROOTS if root in path), path)


def report(group: str, stat: Stat, calls: int) -> tuple[dict[str, Any], str]:
    """The profile of one variant over its ``calls`` timed calls, as JSON and as text."""
    raw: dict[Any, Any] = pstats.Stats(stat.profile).stats  # type: ignore[arg-type,attr-defined]
    split: dict[str, float] = defaultdict(float)
    for (f, _line, _fn), (_cc, _nc, tt, _ct, callers) in raw.items():
        if f != "~":
            split[_layer(f)] += tt
            continue
        total = sum(v[2] for v in callers.values()) or 1.0
        for (cf, _cl, _cn), v in callers.items():
            split[_layer(cf) if cf != "~" else "builtins"] += tt * v[2] / total
    total = sum(split.values()) or 1.0
    out = {
        "counts_per_call": {k: round(sum(v[1] for (f, _, fn), v in raw.items() if f.endswith(a) and b in fn) / calls, 2)
                            for k, (a, b) in _COUNTS.items()},
        "profiled_share": {k: round(v / total, 3) for k, v in sorted(split.items(), key=lambda kv: -kv[1])
                           if v / total >= 0.005},
        "top_own_time": [{"function": f"{_short(f)}:{line}({fn})", "calls_per_call": round(v[1] / calls, 2),
                          "share": round(v[2] / total, 3)}
                         for (f, line, fn), v in sorted(raw.items(), key=lambda kv: -kv[1][2])[:12]],
    }
    counts = ", ".join(f"{k} {v:g}" for k, v in out["counts_per_call"].items())
    lines = [f"-- {group}: {stat.name}; per call: {counts}", "   calling-thread CPU by layer: "
             + ", ".join(f"{k} {v:.0%}" for k, v in out["profiled_share"].items()), "   top functions by own CPU time:"]
    lines += [f"     {t['share']:>5.1%}  ×{t['calls_per_call']:<5g} {t['function']}" for t in out["top_own_time"]]
    return out, "\n".join(lines)
