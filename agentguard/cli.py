"""The ``agentguard`` command: demo, ls, show, timeline, forget, stats, verify, resolve, sweep, doctor, console,
mcp-proxy, help.

    agentguard demo                                  the offline demo, on the embedded SQLite store
    agentguard ls [--json] [--state S] [--task T]    the latest records (--state unknown: held on an unknown outcome)
    agentguard show KEY | timeline TASK | forget KEY | stats [--since 1h]   (see agentguard._cli_ledger)
    agentguard verify [--scope S]                    the ledger's hash chains: exit 1 naming the first tampered entry
    agentguard resolve KEY (--result JSON | --retry | --abandon) [--revision REV]
    agentguard sweep [--batch N]                     delete records past their retention
    agentguard doctor [--workers N] [--pool-size N]  check the store a deployment will use, and a live race on it
    agentguard console [--port N] [--host H]         a local web page: tasks, timelines, held outcomes (console extra)
    agentguard mcp-proxy --config agentguard.toml    the guarding MCP proxy (the mcp extra)
    agentguard help [COMMAND]                        the help, of the command or of one of its commands
    agentguard -V | --version                        (also: python -m agentguard ...)

A KEY or TASK may be given by its start if no other key or task starts the same way (``show ag_3f2a``); a
start several share is refused (status 1) with the matches listed.

``ls``, ``resolve``, ``sweep``, ``console`` (and the ledger's commands) name their store with ``--url URL``
or ``--config agentguard.toml`` (the proxy's config: its ``[store]`` url and scope), else
``$AGENTGUARD_URL``, else ``agentguard.db`` here. They only read or settle records, so they never create a
store: a SQLite file that does not exist is reported as ``no store at PATH``, and an in-memory URL is
refused (it exists only inside the process that opened it).

``ls --json`` prints one JSON document, with these field names (ages in seconds)::

    {"records": [{"scope": str, "task_id": str, "operation": str, "state": str, "attempts": int,
                  "age_seconds": float, "lease_left_seconds": float | null, "key": str, "audit": object | null}]}
    {"unknown": [{"scope": str, "key": str, "task_id": str, "operation": str, "step": str | null,
                  "held": "step" | "body" | "not_stored", "attempts": int, "age_seconds": float,
                  "revision": str}]}  # --unknown

Exit status: 0 done; 1 an error, named on stderr; 2 a usage error — and ``agentguard`` with no command,
which prints the help (nothing was done, so a script that forgot the command must not read success);
130 interrupted; 141 (128 + SIGPIPE, as ``ls`` or ``git log`` end) when the reader of stdout went away
early, e.g. ``agentguard ls | head -3``, which ends quietly.

Each command imports what it needs when it runs, so ``--help`` and ``--version`` answer without loading
SQLAlchemy, pydantic or asyncio (``python -m benchmarks.startup`` measures them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from . import __version__
from ._cli_ledger import add_commands, full_key
from ._errors import CommandError, GuardError
from ._extras import MissingExtraError, install_line, require

if TYPE_CHECKING:
    from ._storeconfig import StoreRef
    from .stores._schema import Replacement

T = TypeVar("T")

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141


def _arun(coro: Coroutine[Any, Any, T]) -> T:
    import asyncio  # (not at the top: --help and --version need no event loop)

    return asyncio.run(coro)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def _existing_store(args: argparse.Namespace) -> StoreRef:
    """The store named by --url/--config, checked before a Guard is built: a Guard would create a missing
    SQLite file, and a command that only reads or settles must never leave an empty store behind."""
    from ._storeconfig import from_arguments, sqlite_file

    ref = from_arguments(args.url, args.config)
    _check_driver(ref.url)
    path = sqlite_file(ref.url)
    if path is not None and not path.exists():
        where = f" (the store of {ref.config})" if ref.config is not None else ""
        raise CommandError(f"no store at {path}{where}: nothing has been recorded there; give the store's URL "
                           "with --url or the proxy's config with --config")
    return ref


def _check_driver(url: str) -> None:
    if url.startswith(("postgresql", "postgres:")):
        require("asyncpg", extra="postgres", by="a postgresql+asyncpg:// store")


async def _records(url: str, scope: str | None, task_id: str | None, limit: int,
                   state: str | None = None) -> list[dict[str, Any]]:
    from ._guard import Guard

    async with Guard(url) as guard:
        rows = await guard.records(scope=scope, task_id=task_id, limit=limit, state=state)
    return [
        {
            "scope": r.scope, "task_id": r.task_id, "operation": r.operation, "state": r.state,
            "attempts": r.attempts, "age_seconds": round(r.age, 3),
            "lease_left_seconds": None if r.lease_left is None else round(r.lease_left, 3),
            "key": r.key, "audit": r.audit or None,
        }
        for r in rows
    ]


async def _unknown(url: str, scope: str | None, limit: int) -> list[dict[str, Any]]:
    from ._guard import Guard

    async with Guard(url) as guard:
        rows = await guard.unknown(scope=scope, limit=limit)
    return [
        {"scope": r["scope"], "key": r["key"], "task_id": r["task_id"], "operation": r["operation"],
         "step": r["step"], "held": r["held"], "attempts": int(r["attempts"]),
         "age_seconds": round(float(r["age"]), 3), "revision": r["revision"]}
        for r in rows
    ]


def _print_table(rows: list[dict[str, Any]]) -> None:
    headers = ("scope", "task", "operation", "state", "attempts", "age", "key", "audit")
    table = [
        (r["scope"], r["task_id"], r["operation"],
         r["state"] + (f" ({r['lease_left_seconds']:.0f}s lease)" if r["lease_left_seconds"] else ""),
         str(r["attempts"]), _age(r["age_seconds"]), r["key"],
         json.dumps(r["audit"], default=str) if r["audit"] else "")
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _ls(args: argparse.Namespace) -> int:
    ref = _existing_store(args)
    scope = args.scope if args.scope is not None else ref.scope
    if args.unknown or args.state == "unknown":
        held = _arun(_unknown(ref.url, scope, args.limit))
        if args.json:
            print(json.dumps({"unknown": held}, default=str))
        elif not held:
            print("no operations with an unknown outcome")
        else:
            for r in held:
                how = f"step={r['step']!r}" if r["step"] is not None else f"held={r['held']}"
                print(f"{r['key']}  scope={r['scope']}  task={r['task_id']}  {r['operation']}  "
                      f"{how}  attempts={r['attempts']}  age={_age(r['age_seconds'])}  revision={r['revision']}")
        return 0
    rows = _arun(_records(ref.url, scope, args.task_id, args.limit, args.state))
    if args.json:
        print(json.dumps({"records": rows}, default=str))
    elif not rows:
        print("no records")
    else:
        _print_table(rows)
    return 0


def _resolve(args: argparse.Namespace) -> int:
    kwargs: dict[str, Any] = {"retry": args.retry, "abandon": args.abandon}
    if args.result is not None:
        try:
            kwargs["result"] = json.loads(args.result)
        except ValueError as exc:
            raise CommandError(f"--result must be JSON: {exc}") from None
    ref = _existing_store(args)
    scope = args.scope or ref.scope or "default"

    async def go() -> str:
        from ._guard import Guard

        async with Guard(ref.url) as guard:
            return await guard.resolve(await full_key(guard, args.key, scope), scope=scope, revision=args.revision,
                                       **kwargs)

    print(_arun(go()))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    ref = _existing_store(args)

    async def go() -> int:
        from ._guard import Guard

        async with Guard(ref.url) as guard:
            return await guard.sweep(batch=args.batch)

    n = _arun(go())
    print(f"deleted {n} expired record{'s' if n != 1 else ''}")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from ._storeconfig import from_arguments

    ref = from_arguments(args.url, args.config)
    _check_driver(ref.url)
    if args.grant and not ref.url.startswith("postgres"):
        raise CommandError("--grant is for a Postgres store (SQLite has no roles)")
    if args.sql:
        from .stores._attempts import keys_ddl
        from .stores._dialects import dialect_for
        from .stores._schema import TABLE, schema_ddl
        from .stores._server import grants
        from .stores._statements import WATCHED_COLUMN
        from .stores._store import REPLACEMENTS

        dialect = dialect_for(ref.url)
        more = [f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS {WATCHED_COLUMN}"] if dialect.announces else []
        more += [index.drop_old() for index in REPLACEMENTS]  # (an earlier version's; the new ones are made above)
        more += keys_ddl(sqlite=dialect.name == "sqlite")  # (the records' trigger; a key index's upgrade)
        if args.grant:
            more += grants(args.grant)
        print("BEGIN;")
        for statement in schema_ddl(dialect.driver_dialect(), more):
            print(f"{statement};")
        print("COMMIT;")
        return 0

    async def go() -> list[Replacement]:
        from .stores import SQLStore

        store = SQLStore(ref.url)
        try:
            await store.ensure_schema()
            return await store.replace_indexes()
        finally:
            await store.dispose()

    from ._redact import redact_url

    for index in _arun(go()):
        print(f"replaced {index.what} of an earlier version ({index.old}) with {index.name}")
    print(f"the store's tables are ready at {redact_url(ref.url)}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from ._storeconfig import from_arguments

    ref = from_arguments(args.url, args.config)  # (a SQLite file that does not exist yet is the doctor's to report)
    _check_driver(ref.url)
    from ._doctor import Settings, run

    settings = Settings(pool_size=args.pool_size, max_connections=args.max_connections, workers=args.workers,
                        race=not args.no_race, keep=args.keep,
                        timeout=args.timeout)
    return run(ref.url, settings, as_json=args.json)


def _seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not n > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return n


def _console(args: argparse.Namespace) -> int:
    require("starlette", "uvicorn", extra="console", by="agentguard console")
    ref = _existing_store(args)
    from .console import _command

    try:
        return _command.serve(ref.url, host=args.host, port=args.port)
    except _command.ServeError as exc:
        raise CommandError(str(exc)) from None


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535 (0: any free port), got {n}")
    return n


def _demo(args: argparse.Namespace) -> int:
    if args.url:
        _check_driver(args.url)
    from ._demo import run_demo

    return run_demo(args.url)


def _mcp_proxy(args: argparse.Namespace) -> int:
    require("mcp", "mcp_types", extra="mcp", by="agentguard mcp-proxy")
    try:
        from .mcp import proxy
    except ImportError as exc:  # installed, but not a version this proxy works with
        print(f"agentguard mcp-proxy could not import the MCP SDK ({exc}); reinstall it with "
              f"{install_line('mcp')}", file=sys.stderr)
        return EXIT_USAGE
    return proxy.main(args.config, http=args.http)


def _store_options(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", metavar="URL",
                       help="the store's URL (default: $AGENTGUARD_URL, else sqlite+aiosqlite:///agentguard.db)")
    where.add_argument("--config", metavar="TOML",
                       help="read the store's URL and scope from the [store] table of a proxy config "
                            "(agentguard.toml); a relative SQLite path is relative to the file's folder")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentguard",
        description="At-most-once tool calls for AI agents: run a tool once per task and operation, replay "
                    "its stored outcome to every repeat.",
        epilog="Run `agentguard help COMMAND` (or `agentguard COMMAND --help`) for a command's options. Exit "
               "status: 0 done, 1 error, 2 usage error (also: no command given).",
    )
    parser.add_argument("-V", "--version", action="version", version=f"agentguard {__version__}",
                        help="print agentguard's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                help="one of these; `agentguard COMMAND --help` shows its options")

    p_demo = sub.add_parser("demo", help="run the offline demo on the embedded SQLite store",
                            description="A scripted agent retries a charge, races five identical calls, "
                                        "crashes a worker with SIGKILL and resumes: one charge per order.")
    p_demo.add_argument("--url", metavar="URL",
                        help="run the demo on this store instead (default: $AGENTGUARD_URL, else "
                             "sqlite+aiosqlite:///agentguard.db)")
    p_demo.set_defaults(run=_demo)

    p_ls = sub.add_parser("ls", help="list the latest records (task, operation, state, attempts, age)",
                          description="List the most recently updated records, newest first.")
    _store_options(p_ls)
    p_ls.add_argument("--scope", help="only this scope (default: every scope; with --config, the config's scope)")
    p_ls.add_argument("--task", dest="task_id", metavar="TASK_ID", help="only this task id")
    p_ls.add_argument("--limit", type=_positive, default=100, metavar="N",
                      help="at most N records (default: 100)")
    p_ls.add_argument("--unknown", action="store_true",
                      help="only operations held on an unknown outcome: a worker died inside a step or the body, "
                           "or the body's result could not be stored (settle them with resolve)")
    p_ls.add_argument("--state", choices=("running", "succeeded", "failed", "released", "unknown"),
                      help="only records in this state (unknown: as --unknown)")
    p_ls.add_argument("--json", action="store_true",
                      help='print one JSON document for scripts: {"records": [{scope, task_id, operation, state, '
                           "attempts, age_seconds, lease_left_seconds, key, audit}]}; with --unknown "
                           '{"unknown": [{scope, key, task_id, operation, step, held, attempts, age_seconds, '
                           "revision}]}")
    p_ls.set_defaults(run=_ls)

    add_commands(sub, _store_options, _existing_store, _positive)

    p_resolve = sub.add_parser("resolve", help="settle an operation held on an unknown outcome",
                               description="Settle an operation held on an unknown outcome (agentguard ls "
                                           "--unknown): its worker died inside a step or inside the body, or "
                                           "the body ran and its result could not be stored. Record the real "
                                           "outcome, run it again, or give the operation up.")
    _store_options(p_resolve)
    p_resolve.add_argument("key", help="the operation's key (agentguard ls --unknown), or its start if no other key "
                                       "starts so")
    p_resolve.add_argument("--scope", help="the operation's scope (default: the config's scope, else 'default')")
    how = p_resolve.add_mutually_exclusive_group(required=True)
    how.add_argument("--result", metavar="JSON",
                     help="the real outcome, as JSON (e.g. the provider's charge): the step's, or the "
                          "operation's, which every later call then receives")
    how.add_argument("--retry", action="store_true",
                     help="run it again (the same key or sub-key) on the next call")
    how.add_argument("--abandon", action="store_true", help="give the operation up: every later call errors")
    p_resolve.add_argument("--revision", metavar="REV",
                           help="the revision of the record you decided on (agentguard ls --unknown prints it): if "
                                "the record changed since, nothing is done and what changed is said (exit 1); the "
                                "same decision made twice is done once ('already applied', exit 0)")
    p_resolve.set_defaults(run=_resolve)

    p_sweep = sub.add_parser("sweep", help="delete records past their retention",
                             description="Delete records past their retention, in bounded batches.")
    _store_options(p_sweep)
    p_sweep.add_argument("--batch", type=_positive, default=1000, metavar="N",
                         help="delete at most N records per statement (default: 1000)")
    p_sweep.set_defaults(run=_sweep)

    p_migrate = sub.add_parser("migrate", help="create the store's tables, or print the SQL that does",
                               description="Create the store's tables and indexes where missing (as the guard does "
                                           "on first use), or print that SQL for an administrator to run, so that "
                                           "workers may use a role that cannot create tables.")
    _store_options(p_migrate)
    p_migrate.add_argument("--sql", action="store_true",
                           help="print the SQL (one transaction, for the store's dialect) instead of running it")
    p_migrate.add_argument("--grant", metavar="ROLE",
                           help="with --sql, also grant ROLE what every call needs on the tables (Postgres)")
    p_migrate.set_defaults(run=_migrate)

    p_doctor = sub.add_parser(
        "doctor", help="check the store a deployment will use: server, pooler, rights, clock, budget, a live race",
        description="Check the store your workers will use, through the same URL (SQLite file, Postgres, or "
                    "Postgres behind a pooler), and print a line per check: server version and read-only mode, "
                    "pooler mode, isolation, clock offset, privileges, listen/notify, round trip, the connection "
                    "budget against max_connections; then a short live race on a scratch scope of its own "
                    "(parallel callers on one key while the winner's completion is made to fail: its connection "
                    "killed on Postgres, the file locked on SQLite), which must end with one execution. What the "
                    "race wrote is deleted; no other scope is touched. Exit status 0 when no line failed, 1 when "
                    "one did (each failed line says what to change).")
    _store_options(p_doctor)
    p_doctor.add_argument("--workers", type=_positive, default=1, metavar="N",
                          help="worker processes that will share the store, for the connection budget (default: 1)")
    p_doctor.add_argument("--pool-size", type=_positive, default=10, metavar="N",
                          help="the pool_size your guards use (default: 10, Guard's)")
    p_doctor.add_argument("--max-connections", type=_positive, default=None, metavar="N",
                          help="the max_connections your guards use, each worker's connection budget "
                               "(default: 3 × --pool-size, Guard's)")
    p_doctor.add_argument("--no-race", action="store_true",
                          help="skip the live race: check only, write nothing")
    p_doctor.add_argument("--keep", action="store_true",
                          help="leave what the race wrote (its scope is printed) for `agentguard ls --scope S`; "
                               "it expires within the hour")
    p_doctor.add_argument("--timeout", type=_seconds, default=10.0, metavar="SECONDS",
                          help="how long to wait for a connection (default: 10)")
    p_doctor.add_argument("--json", action="store_true",
                          help='print one JSON document: {"url", "ok", "lines": [{check, status, found, fix}], '
                               '"race": {callers, executions, results, replayed, errors, failures, ...} | null}')
    p_doctor.set_defaults(run=_doctor)

    p_console = sub.add_parser("console", help="serve a local web page: tasks, timelines, held outcomes to settle",
                               description="Serve a page of the store's tasks, each task's timeline and the "
                                           "operations held on an unknown outcome, with actions to settle them "
                                           "(what `agentguard resolve` does). Prints the URL with a token: "
                                           "without it the page is read-only. Needs the console extra.")
    _store_options(p_console)
    p_console.add_argument("--port", type=_port, default=8765, metavar="N",
                           help="the port to listen on (default: 8765; 0: any free port, printed)")
    p_console.add_argument("--host", default="127.0.0.1",
                           help="the address to listen on (default: 127.0.0.1, this machine only)")
    p_console.set_defaults(run=_console)

    p_proxy = sub.add_parser("mcp-proxy", help="serve a guarding MCP proxy over stdio (needs the mcp extra)",
                             description="Guard the tools a config names in front of any MCP server; "
                                         "checks the store and the upstream's tools first (exit 2 on a problem).")
    p_proxy.add_argument("--config", required=True, metavar="TOML", help="path to agentguard.toml")
    p_proxy.add_argument("--http", metavar="[HOST:]PORT",
                         help="serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio, to many hosts "
                              "(host default 127.0.0.1; needs [proxy] token or $AGENTGUARD_PROXY_TOKEN)")
    p_proxy.set_defaults(run=_mcp_proxy)

    commands = dict(sub.choices)  # (every command but help itself)
    p_help = sub.add_parser("help", help="show this help, or a command's (agentguard help show)",
                            description="Show the help of agentguard, or of one of its commands.")
    p_help.add_argument("topic", nargs="?", metavar="COMMAND", choices=sorted(commands),
                        help="the command whose help to show (default: agentguard's own)")
    p_help.set_defaults(run=lambda args: _help(commands.get(args.topic, parser)))
    return parser


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if args.command is None:  # only global options, e.g. `agentguard --url x`
        parser.print_usage(sys.stderr)
        print("agentguard: error: a command is required", file=sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.run(args)
        if args.command != "mcp-proxy":
            sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except MissingExtraError as exc:
        print(f"agentguard: {exc}", file=sys.stderr)
        return EXIT_USAGE if args.command == "mcp-proxy" else EXIT_ERROR
    except (CommandError, GuardError, ValueError) as exc:
        print(f"agentguard: {exc}", file=sys.stderr)  # (facts: no tool is involved here)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (`agentguard ls | head`): stop quietly. stdout is pointed at /dev/null so the
        # interpreter's final flush of what is still buffered cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
