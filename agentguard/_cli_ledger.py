"""The ``agentguard`` commands that read the ledger of attempts, and ``forget``:

    agentguard show KEY [--scope S] [--json]           the record, its steps and its attempts
    agentguard timeline TASK [--scope S] [--json]      what the agent did in a task, in order
    agentguard forget KEY [--scope S] [--yes]          delete a completed or failed record: the next call runs
    agentguard stats [--since 1h] [--scope S] [--json] per tool: calls, replay rate, refusals, takeovers, guard time

A KEY (and ``resolve``'s, in ``cli``) may be given by its start, as long as no other key starts the same way
(``agentguard show ag_3f2a``), and a TASK likewise; a start several share is refused with the matches listed.
Like ``ls``, they never create a store (``cli._existing_store``); a store made by an earlier version gets the
ledger's table on first use, under the schema lock. ``--json`` prints one document: ``show``: ``{"record":
{...}, "steps": [...], "attempts": [...]}``; ``timeline``: ``{"task_id": str, "attempts": [...]}``; ``forget``:
``{"forgotten": {...}}``; ``stats``: ``{"since": float | null, "tools": [...]}``. Each attempt has the fields
of :class:`agentguard.stores.Attempt`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import CommandError, GuardError

if TYPE_CHECKING:  # (the command's --help must not wait for SQLAlchemy: the stores are imported when used)
    from ._guard import Guard
    from ._storeconfig import StoreRef
    from .stores import Attempt, RecordDetail

T = TypeVar("T")
_MARK = {"replayed": "REPLAY ", "refused": "REFUSED", "took_over": "TAKEOVR", "released": "RELEASE",
         "lease_lost": "LOST   ", "unknown": "UNKNOWN", "forgotten": "FORGOT ", "resolved": "RESOLVE",
         "went_away": "GONE   "}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SHOWN = 10  # the matches an ambiguous start lists


def duration(text: str) -> float:
    """``90``, ``30s``, ``15m``, ``1h``, ``7d`` as seconds (argparse type)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90, 30s, 15m, 1h, 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _run(ref: StoreRef, go: Callable[[Guard], Awaitable[T]]) -> T:
    import asyncio

    async def main() -> T:
        from ._guard import Guard

        async with Guard(ref.url) as guard:
            return await go(guard)

    return asyncio.run(main())


async def full_key(g: Guard, given: str, scope: str | None) -> str:
    """The key a person meant: ``given`` itself, or the one key that starts with it. Several keys starting
    with it are a CommandError listing them; none, ``given`` unchanged (the command then says it has no such
    record)."""
    from .stores import SQLStore, _prefixes

    store = g._store
    if not isinstance(store, SQLStore):
        return given
    found = await _prefixes.keys(store, given, scope=scope, limit=SHOWN + 1)
    distinct = list(dict.fromkeys(k for k, _, _, _ in found))  # one key may be in several scopes
    if given in distinct or len(distinct) <= 1:
        return distinct[0] if len(distinct) == 1 else given
    raise CommandError(_ambiguous("key", given, [f"  {k}  scope={s}  task={t}  {o or '(no record)'}"
                                                 for k, s, t, o in found]))


async def full_task(g: Guard, given: str, scope: str | None) -> str:
    """The task a person meant: ``given`` itself, or the one task id that starts with it (as ``full_key``)."""
    from .stores import SQLStore, _prefixes

    store = g._store
    if not isinstance(store, SQLStore):
        return given
    found = await _prefixes.tasks(store, given, scope=scope, limit=SHOWN + 1)
    distinct = list(dict.fromkeys(t for t, _ in found))
    if given in distinct or len(distinct) <= 1:
        return distinct[0] if len(distinct) == 1 else given
    raise CommandError(_ambiguous("task", given, [f"  {t}  scope={s}" for t, s in found]))


def _ambiguous(what: str, given: str, lines: list[str]) -> str:
    more = [f"  ... and more (the first {SHOWN} are shown)"] if len(lines) > SHOWN else []
    return "\n".join([f"{given!r} is the start of several {what}s; give more of it, or the whole {what}:",
                      *lines[:SHOWN], *more])


def _entry_line(e: Attempt, *, with_operation: bool) -> str:
    what = f"  {e.operation}" if with_operation else ""
    extra = "".join(f"  {k}={v}" for k, v in (("call", e.call_id), ("process", e.process)) if v)
    timing = f"  guard={e.guard_ms:.2f}ms" if e.guard_ms is not None else ""
    waited = f"  waited={e.wait_ms:.0f}ms" if e.wait_ms else ""
    return (f"{_when(e.at)}  {_MARK.get(e.kind, '       ')}  {e.kind:<9}{what}  attempt={e.attempt}  {e.detail}"
            f"{timing}{waited}{extra}")


def _show(args: argparse.Namespace, ref: StoreRef) -> int:
    scope = args.scope if args.scope is not None else ref.scope

    async def go(g: Guard) -> tuple[RecordDetail | None, str, list[Attempt]]:
        key = await full_key(g, args.key, scope)
        try:
            rec = await g.record(key, scope=scope)
        except GuardError:
            # No record (forgotten, or swept): the ledger still tells what became of the key, in its one scope.
            entries = await g.attempts(key=key, scope=scope)
            if not entries or len({e.scope for e in entries}) > 1:
                raise
            return None, key, entries
        return rec, rec.key, await g.attempts(key=rec.key, scope=rec.scope)

    rec, key, entries = _run(ref, go)
    if args.json:
        record = None if rec is None else {k: v for k, v in asdict(rec).items() if k != "steps"}
        steps = [] if rec is None else [{"name": n, "seq": s, "state": st, "result": r} for n, s, st, r in rec.steps]
        print(json.dumps({"record": record, "steps": steps, "attempts": [e.as_dict() for e in entries]}))
        return 0
    if rec is None:
        print(f"{key}  scope={entries[0].scope}  task={entries[0].task_id}\n  operation  {entries[0].operation}\n"
              "  no record: forgotten, or swept after its retention (its attempts are kept for theirs)")
    else:
        _print_record(rec)
    print(f"attempts ({len(entries)}):" if entries else "no attempts in the ledger")
    for e in entries:
        print("  " + _entry_line(e, with_operation=False))
    return 0


def _print_record(rec: RecordDetail) -> None:
    lease = f" (lease {rec.lease_left:.0f}s left)" if rec.lease_left is not None and rec.lease_left > 0 else ""
    print(f"{rec.key}  scope={rec.scope}  task={rec.task_id}\n  operation  {rec.operation}\n  state      "
          f"{rec.state}{lease}\n  attempts   {rec.attempts}\n  created    {rec.age:.0f}s ago, updated "
          f"{rec.updated_ago:.0f}s ago, expires in {rec.expires_in / 3600:.1f}h")
    if rec.result is not None:
        print(f"  result     {rec.result}")
    if rec.audit:
        print(f"  audit      {rec.audit}")
    for name, seq, state, result in rec.steps:
        print(f"  step {seq}: {name} {state}" + (f" {result}" if result is not None else ""))


def _timeline(args: argparse.Namespace, ref: StoreRef) -> int:
    scope = args.scope if args.scope is not None else ref.scope

    async def go(g: Guard) -> tuple[str, list[Attempt]]:
        task_id = await full_task(g, args.task_id, scope)
        return task_id, await g.timeline(task_id, scope=scope, limit=args.limit)

    task_id, entries = _run(ref, go)
    if args.json:
        print(json.dumps({"task_id": task_id, "attempts": [e.as_dict() for e in entries]}))
        return 0
    if not entries:
        print(f"task {task_id!r} has records but no attempts in the ledger (kept by an earlier version)")
    for e in entries:
        print(_entry_line(e, with_operation=True))
    return 0


def _forget(args: argparse.Namespace, ref: StoreRef) -> int:
    scope = args.scope if args.scope is not None else ref.scope

    async def find(g: Guard) -> RecordDetail:
        return await g.record(await full_key(g, args.key, scope), scope=scope)

    rec = _run(ref, find)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CommandError(f"forget deletes the record of {rec.operation!r} in task {rec.task_id!r} "
                               f"({rec.state}), so its next call runs the tool again; confirm with --yes")
        answer = input(f"Delete the {rec.state} record of {rec.operation} in task {rec.task_id}? The next call "
                       "runs the tool again. [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    gone = _run(ref, lambda g: g.forget(rec.key, scope=rec.scope))
    if args.json:
        print(json.dumps({"forgotten": {k: v for k, v in asdict(gone).items() if k != "steps"}}))
    else:
        print(f"forgot {gone.key} ({gone.operation} in task {gone.task_id}, was {gone.state}); its next call runs")
    return 0


def _stats(args: argparse.Namespace, ref: StoreRef) -> int:
    scope = args.scope if args.scope is not None else ref.scope
    since = None if args.since is None else time.time() - args.since
    tools = _run(ref, lambda g: g.stats(since=since, scope=scope))
    if args.json:
        print(json.dumps({"since": since, "tools": tools}))
        return 0
    if not tools:
        print("no calls in the ledger" + (" in that time" if since is not None else ""))
        return 0
    headers = ("tool", "calls", "replay rate", "refused", "took over", "went away", "guard p50", "guard p99")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}ms"

    rows = [(t["tool"], str(t["calls"]), f"{t['replay_rate']:.0%}", str(t["refused"]), str(t["took_over"]),
             str(t["went_away"]), ms(t["guard_ms_p50"]), ms(t["guard_ms_p99"])) for t in tools]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _verify(args: argparse.Namespace, ref: StoreRef) -> int:
    scope = args.scope if args.scope is not None else ref.scope
    checks = _run(ref, lambda g: g.verify_ledger(scope=scope))
    failed = [c for c in checks if not c.ok]
    if args.json:
        print(json.dumps({"ok": not failed, "scopes": [{**asdict(c), "ok": c.ok} for c in checks]}))
        return 1 if failed else 0
    if not checks:
        print("the ledger has no entries" + (f" in scope {scope!r}" if scope is not None else ""))
    for c in checks:
        older = f"; {c.unchained} older entries not chained (written before the store had a chain)" if c.unchained \
            else ""
        if c.ok:
            span = f" (seq {c.first} to {c.last})" if c.entries else ""
            print(f"ok        scope {c.scope!r}: {c.entries} entries verified{span}, head {c.head or '-'}{older}")
        else:
            print(f"TAMPERED  scope {c.scope!r}: {c.problem}{older}")
    return 1 if failed else 0


def add_commands(sub: Any, store_options: Callable[[argparse.ArgumentParser], None],
                 existing: Callable[[argparse.Namespace], StoreRef], positive: Callable[[str], int]) -> None:
    """Register show, timeline, forget, stats and verify on the ``agentguard`` parser's subparsers."""

    def on_store(fn: Callable[[argparse.Namespace, StoreRef], int]) -> Callable[[argparse.Namespace], int]:
        return lambda args: fn(args, existing(args))

    def common(p: argparse.ArgumentParser, json_help: str) -> None:
        store_options(p)
        p.add_argument("--scope", help="only this scope (default: every scope; with --config, the config's scope)")
        p.add_argument("--json", action="store_true", help=json_help)

    p = sub.add_parser("show", help="one record in full: its state, steps and attempts",
                       description="Show one record (by its key, from agentguard ls) with its steps and every "
                                   "attempt the ledger kept.")
    p.add_argument("key", help="the record's key (agentguard ls), or its start if no other key starts so")
    common(p, 'print {"record": {...}, "steps": [...], "attempts": [...]}')
    p.set_defaults(run=on_store(_show))

    p = sub.add_parser("timeline", help="what the agent did in a task, in order (replays and refusals marked)",
                       description="Every attempt of every operation of one task, in the order they happened.")
    p.add_argument("task_id", metavar="TASK", help="the task id, or its start if no other task's id starts so")
    p.add_argument("--limit", type=positive, default=1000, metavar="N", help="at most N entries (default 1000)")
    common(p, 'print {"task_id": str, "attempts": [...]}')
    p.set_defaults(run=on_store(_timeline))

    p = sub.add_parser("forget", help="delete a completed or failed record so that its next call runs again",
                       description="Delete a completed, failed or released record on purpose (never a running "
                                   "claim): the next call of the operation runs the tool again. Asks first, "
                                   "unless --yes. Leaves a 'forgotten' entry in the ledger.")
    p.add_argument("key", help="the record's key (agentguard ls), or its start if no other key starts so")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    common(p, 'print {"forgotten": {...}}')
    p.set_defaults(run=on_store(_forget))

    p = sub.add_parser("stats", help="per tool: calls, replay rate, refusals, takeovers, p50/p99 guard time",
                       description="Statistics of the ledger, per tool.")
    p.add_argument("--since", type=duration, metavar="DURATION",
                   help="only the last DURATION (90, 30s, 15m, 1h, 7d; default: everything kept)")
    common(p, 'print {"since": float | null, "tools": [{tool, calls, replayed, replay_rate, refused, took_over, '
              "went_away, guard_ms_p50, guard_ms_p99}]}")
    p.set_defaults(run=on_store(_stats))

    p = sub.add_parser("verify", help="check the ledger's hash chains: exit 1 naming the first entry tampered with",
                       description="Walk each scope's hash chain of ledger entries and operators' acts, in one "
                                   "snapshot. Exits 1, naming the first entry that was edited, deleted or "
                                   "reordered, if any; prints each chain's head digest (keep a copy elsewhere: "
                                   "it proves every entry up to it).")
    common(p, 'print {"ok": bool, "scopes": [{scope, ok, entries, first, last, head, unchained, problem, '
              "entry_id, seq}]}")
    p.set_defaults(run=on_store(_verify))
