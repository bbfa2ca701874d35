"""The ``agentguard`` command: demo, ls, sweep, mcp-proxy."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

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
    headers = ("scope", "task", "operation", "state", "attempts", "age", "key")
    table = [
        (r.scope, r.task_id, r.operation, r.state + (f" ({r.lease_left:.0f}s lease)" if r.lease_left else ""),
         str(r.attempts), _age(r.age), r.key)
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
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
            return asyncio.run(_ls(args.url, args.scope, args.task_id, args.limit))
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
