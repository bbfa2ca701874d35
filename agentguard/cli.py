"""The ``agentguard`` command: demo, ls, resolve, sweep, mcp-proxy."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import GuardError


def _url_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="store URL (default: $AGENTGUARD_URL, else sqlite+aiosqlite:///agentguard.db)")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


async def _ls(url: str | None, scope: str | None, task_id: str | None, limit: int) -> int:
    from ._guard import Guard

    async with Guard(url) as guard:
        rows = await guard.records(scope=scope, task_id=task_id, limit=limit)
    if not rows:
        print("no records")
        return 0
    headers = ("scope", "task", "operation", "state", "attempts", "age", "key", "audit")
    table = [
        (r.scope, r.task_id, r.operation, r.state + (f" ({r.lease_left:.0f}s lease)" if r.lease_left else ""),
         str(r.attempts), _age(r.age), r.key, json.dumps(r.audit, default=str) if r.audit else "")
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


async def _ls_unknown(url: str | None, scope: str | None, limit: int) -> int:
    from ._guard import Guard

    async with Guard(url) as guard:
        rows = await guard.unknown(scope=scope, limit=limit)
    if not rows:
        print("no operations with an unknown outcome")
        return 0
    for r in rows:
        print(f"{r['key']}  scope={r['scope']}  task={r['task_id']}  {r['operation']}  step={r['step']!r}  "
              f"attempts={r['attempts']}  age={_age(float(r['age']))}")
    return 0


async def _resolve(url: str | None, key: str, scope: str, result: str | None, retry: bool, abandon: bool) -> int:
    from ._guard import Guard

    kwargs: dict[str, Any] = {"retry": retry, "abandon": abandon}
    if result is not None:
        try:
            kwargs["result"] = json.loads(result)
        except ValueError as exc:
            raise ValueError(f"--result must be JSON: {exc}") from None
    async with Guard(url) as guard:
        print(await guard.resolve(key, scope=scope, **kwargs))
    return 0


async def _sweep(url: str | None, batch: int) -> int:
    from ._guard import Guard

    async with Guard(url) as guard:
        n = await guard.sweep(batch=batch)
    print(f"deleted {n} expired record{'s' if n != 1 else ''}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentguard", description="At-most-once tool calls for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    p_demo = sub.add_parser("demo", help="run the offline demo on the embedded SQLite store")
    _url_arg(p_demo)

    p_ls = sub.add_parser("ls", help="list records (task, operation, state, attempts, age)")
    _url_arg(p_ls)
    p_ls.add_argument("--scope")
    p_ls.add_argument("--task", dest="task_id")
    p_ls.add_argument("--limit", type=int, default=100)
    p_ls.add_argument("--unknown", action="store_true", help="only operations with a step of unknown outcome")

    p_resolve = sub.add_parser("resolve", help="settle an operation held on an unknown outcome")
    _url_arg(p_resolve)
    p_resolve.add_argument("key", help="the operation's key (agentguard ls --unknown)")
    p_resolve.add_argument("--scope", default="default")
    how = p_resolve.add_mutually_exclusive_group(required=True)
    how.add_argument("--result", help="the step's real outcome, as JSON (e.g. the provider's charge)")
    how.add_argument("--retry", action="store_true", help="run the step again (same sub-key) on the next attempt")
    how.add_argument("--abandon", action="store_true", help="give the operation up: every later call errors")

    p_sweep = sub.add_parser("sweep", help="delete records past their retention")
    _url_arg(p_sweep)
    p_sweep.add_argument("--batch", type=int, default=1000)

    p_proxy = sub.add_parser("mcp-proxy", help="serve a guarding MCP proxy over stdio (needs agentguard[mcp])")
    p_proxy.add_argument("--config", required=True, help="path to agentguard.toml")

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from ._demo import run_demo

            return run_demo(args.url)
        if args.command == "ls":
            if args.unknown:
                return asyncio.run(_ls_unknown(args.url, args.scope, args.limit))
            return asyncio.run(_ls(args.url, args.scope, args.task_id, args.limit))
        if args.command == "resolve":
            return asyncio.run(_resolve(args.url, args.key, args.scope, args.result, args.retry, args.abandon))
        if args.command == "sweep":
            return asyncio.run(_sweep(args.url, args.batch))
        if args.command == "mcp-proxy":
            try:
                from .mcp import proxy
            except ImportError as exc:
                print(f"agentguard mcp-proxy needs the mcp extra: pip install 'agentguard[mcp]' ({exc})",
                      file=sys.stderr)
                return 2
            return proxy.main(args.config)
    except (GuardError, ValueError) as exc:
        print(f"agentguard: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
