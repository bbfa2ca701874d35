"""The verdict of a chaos run, from what it left behind (a pure function: ``tests/test_chaos.py`` feeds it
broken runs and checks that it says so)."""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    calls: int = 0
    charges: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    events: collections.Counter[str] = field(default_factory=collections.Counter)


def judge(
    ops: Sequence[tuple[str, str, str, int]], stats: dict[str, Any], stored: dict[str, Any], held: list[str],
    results: Sequence[tuple[int, str]],
) -> Verdict:
    """``ops``: (task id, tool, order id, amount); ``stats``: the provider's; ``stored``: each operation's
    stored result (replayed after the run); ``held``: the records left running or released, described;
    ``results``: each worker's index and the lines it wrote."""
    v = Verdict(problems=list(held))
    orders = {order for _, _, order, _ in ops}
    for order in sorted(orders):
        charges = stats["charges"].get(order, [])
        v.charges += len(charges)
        if len(charges) != 1:
            v.problems.append(f"{order}: {len(charges)} charges at the provider, not exactly one")
        if len(stats["keys"].get(order, [])) != 1:
            v.problems.append(f"{order}: charged under {len(stats['keys'].get(order, []))} keys, not one")
    for task_id, _, _, _ in ops:
        if task_id not in stored:
            v.problems.append(f"{task_id}: no stored result")
    for index, text in results:
        answered: set[str] = set()
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a SIGKILL
            if "event" in entry:
                v.events[entry["event"]] += 1
            elif "result" in entry:
                v.calls += 1
                answered.add(entry["op"])
                if entry["op"] in stored and entry["result"] != stored[entry["op"]]:
                    v.problems.append(f"worker {index} got {entry['result']} for {entry['op']}, but "
                                      f"{stored[entry['op']]} is stored")
            elif "error" in entry:
                v.calls += 1
                v.errors[entry["error"]] += 1
                if "unexpected" in entry or entry["error"] == "gave up":
                    v.problems.append(f"worker {index}: {entry['error']} for {entry['op']} "
                                      f"{entry.get('unexpected', '')}".rstrip())
        missing = {t for t, _, _, _ in ops} - answered
        if missing:
            v.problems.append(f"worker {index} has no answer for {len(missing)} operations")
    return v
