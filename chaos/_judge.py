"""The verdict of a chaos run, from what it left behind (a pure function: ``tests/project/test_chaos.py`` feeds it
broken runs and checks that it says so)."""

from __future__ import annotations

import collections
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SYNC_KINDS = ("threads", "sync")  # the workers whose charge is a sync tool (chaos._worker.KINDS)


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    calls: int = 0
    charges: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    events: collections.Counter[str] = field(default_factory=collections.Counter)
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)  # calls answered, per kind
    bodies: collections.Counter[str] = field(default_factory=collections.Counter)  # bodies started, per kind
    own: collections.Counter[str] = field(default_factory=collections.Counter)  # own-thread connections, per kind
    gathered: collections.Counter[str] = field(default_factory=collections.Counter)  # statements for many callers


def judge(
    ops: Sequence[tuple[str, str, str, int]], stats: dict[str, Any], stored: dict[str, Any], held: list[str],
    results: Sequence[tuple[int, str]], *, expected: Mapping[int, Collection[str]] | None = None,
    kinds: Mapping[int, str] | None = None, own_threads: bool = False, gathers: bool = False,
) -> Verdict:
    """``ops``: (task id, tool, order id, amount); ``stats``: the provider's; ``stored``: each operation's
    stored result (replayed after the run); ``held``: what the replay found wrong (records left running or
    released, a sync replay unlike the async one), described; ``results``: each worker's index and the lines
    it wrote; ``expected``: the operations each worker calls (default: all); ``kinds``: how each worker calls
    its tools (default: async); ``own_threads``: whether the store has a sync executor, so that sync tools'
    calls must have been claimed in their callers' threads (on connections those threads opened); ``gathers``:
    whether the store gathers statements (Postgres), so that the gathered workers' claims and completions must
    have gone as statements for many callers."""
    v = Verdict(problems=list(held))
    kinds = kinds or {}
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
    every = {t for t, _, _, _ in ops}
    for index, text in results:
        kind = kinds.get(index, "async")
        answered: set[str] = set()
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a SIGKILL
            if "event" in entry:
                v.events[entry["event"]] += 1
            elif "body" in entry:
                v.bodies[kind] += 1
            elif "own_connection" in entry:
                v.own[kind] += 1
            elif "gathered" in entry:
                v.gathered[entry["gathered"]] += 1
            elif "result" in entry:
                v.calls += 1
                v.by_kind[kind] += 1
                answered.add(entry["op"])
                if entry["op"] in stored and entry["result"] != stored[entry["op"]]:
                    v.problems.append(f"worker {index} got {entry['result']} for {entry['op']}, but "
                                      f"{stored[entry['op']]} is stored")
            elif "error" in entry:
                v.calls += 1
                v.by_kind[kind] += 1
                v.errors[entry["error"]] += 1
                if "unexpected" in entry or entry["error"] == "gave up":
                    v.problems.append(f"worker {index}: {entry['error']} for {entry['op']} "
                                      f"{entry.get('unexpected', '')}".rstrip())
        missing = set(every if expected is None else expected[index]) - answered
        if missing:
            v.problems.append(f"worker {index} has no answer for {len(missing)} operations")
    for kind in sorted(set(kinds.values()) & set(SYNC_KINDS)):
        if own_threads and not v.own[kind]:
            v.problems.append(f"the {kind} workers' sync tools never claimed in their own threads: the faults "
                              "never met that executor")
    if gathers and "gathered" in kinds.values():
        for what, named in (("claim", "claims"), ("complete", "completions")):
            if not v.gathered[what]:
                v.problems.append(f"the gathered workers' {named} never went as one statement: the faults never met "
                                  "that executor")
    return v
