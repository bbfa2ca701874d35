"""One suite, both databases. ``AGENTGUARD_TEST_BACKEND=sqlite|postgres`` picks the store; with postgres,
``AGENTGUARD_TEST_PG_URL`` points at a server (``scripts/test.sh`` starts a throwaway one). Each test gets its
own SQLite file or its own empty Postgres database (new, or one an earlier test finished with, emptied and
checked empty: see ``pg_database``), so tests never see each other's records."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from agentguard import Guard

BACKEND = os.environ.get("AGENTGUARD_TEST_BACKEND", "sqlite")
PG_URL = os.environ.get("AGENTGUARD_TEST_PG_URL", "")
if BACKEND not in ("sqlite", "postgres"):
    raise RuntimeError(f"AGENTGUARD_TEST_BACKEND must be sqlite or postgres, got {BACKEND!r}")
if BACKEND == "postgres" and not PG_URL:
    raise RuntimeError("AGENTGUARD_TEST_BACKEND=postgres needs AGENTGUARD_TEST_PG_URL (scripts/test.sh sets it)")


# Agent frameworks whose tests run in a virtualenv of their own (scripts/test.sh): each pins a dependency the main
# one cannot hold (strands-agents: mcp<2.2; crewai: mcp 1.x). Where one is absent, its test file and its example
# are left out, and said so (tests/project/test_examples.py).
OWN_VIRTUALENV = {"strands": "integrations/test_integration_strands.py",
                  "crewai": "integrations/test_integration_crewai.py"}
# The frameworks a run must have (module names), named by scripts/test.sh: a missing one fails the run, never
# skips it. Other runs (a quick local loop) need none of them beyond what their test files import.
REQUIRED_FRAMEWORKS = os.environ.get("AGENTGUARD_TEST_FRAMEWORKS", "").split()
_absent = [m for m in REQUIRED_FRAMEWORKS if importlib.util.find_spec(m) is None]
if _absent:
    raise RuntimeError(f"AGENTGUARD_TEST_FRAMEWORKS names {', '.join(_absent)}, not installed here: the run would "
                       "leave their tests out")


def framework_absent(module: str) -> bool:
    return module not in REQUIRED_FRAMEWORKS and importlib.util.find_spec(module) is None


collect_ignore = [path for module, path in OWN_VIRTUALENV.items() if framework_absent(module)]


def tid() -> str:
    """A fresh task id for one test."""
    return "t-" + uuid.uuid4().hex[:12]


ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="Postgres-only test (AGENTGUARD_TEST_BACKEND=postgres)")
    once = pytest.mark.skip(reason="independent of the store's backend: runs once, in the SQLite pass")
    for item in items:
        if "postgres" in item.keywords:
            if BACKEND != "postgres":
                item.add_marker(skip)
        elif "storeless" in item.keywords and BACKEND != "sqlite":
            item.add_marker(once)
    # The long property runs first (a stable sort: every xdist worker collects the same order), so no worker
    # ends a pass alone on one while the others wait.
    items.sort(key=lambda item: "long_run" not in item.keywords)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A long property run is not traced by coverage (where coverage runs): its hundreds of generated programs go
    through lines the example tests count, and tracing them doubled its time. What the run proves is unchanged."""
    tracer = _coverage_running() if item.get_closest_marker("long_run") else None
    if tracer is None:
        return (yield)
    tracer.stop()
    try:
        return (yield)
    finally:
        tracer.start()


def _coverage_running() -> Any:
    if "coverage" not in sys.modules:  # not installed, or not measuring this run
        return None
    import coverage

    return coverage.Coverage.current()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _pg_admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg_dsn(PG_URL))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def pg_execute(url: str, sql: str) -> Any:
    """Run one statement on the test database with plain asyncpg (for tests that poke the server)."""
    import asyncpg

    async def go() -> Any:
        conn = await asyncpg.connect(pg_dsn(url))
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    return asyncio.run(go())


async def raw_exec(url: str, sql: str) -> None:
    """Run SQL on the store's database behind the guard's back (plain drivers, not agentguard)."""
    if url.startswith("sqlite"):
        path = make_url(url).database
        assert path
        conn = sqlite3.connect(path, timeout=30)
        try:
            conn.executescript(sql)
        finally:
            conn.close()
        return
    import asyncpg

    conn2 = await asyncpg.connect(pg_dsn(url))
    try:
        await conn2.execute(sql)
    finally:
        await conn2.close()


# Postgres databases a test has finished with, emptied for the next test: making one costs the server 0.1-0.4 s
# (a copy of its template, written to the WAL), about a third of the Postgres pass's time, where emptying one
# costs a few milliseconds.
_EMPTIED: list[str] = []
# What a database holds beyond an empty public schema: none of it may be handed to another test.
_LEFT_OVER = """
SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
          AND n.nspname NOT LIKE 'pg_temp%')
     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema'))
     + (SELECT count(*) FROM pg_namespace
        WHERE nspname NOT IN ('public', 'pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg_t%')
     + (SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = 'public')
"""


def pg_database() -> str:
    """An empty database on the test server, for one test: one a test emptied, or a new one."""
    if _EMPTIED:
        return _EMPTIED.pop()
    name = "t_" + uuid.uuid4().hex[:20]
    asyncio.run(_pg_admin(f"CREATE DATABASE {name}"))
    return name


def pg_database_done(name: str) -> None:
    """The test is done with ``name``: empty it for the next test, or drop it where that cannot be made sure
    (the test dropped it, a session would not leave, something is left)."""
    if not asyncio.run(_pg_empty(name)):
        asyncio.run(_pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        return
    _EMPTIED.append(name)


async def _pg_sessions_gone(admin: Any, name: str) -> bool:
    """End every session on ``name`` (a test's leftovers) and wait until none is left."""
    for _ in range(500):
        if not await admin.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                    " WHERE datname = $1 AND pid <> pg_backend_pid()", name):
            return True
        await asyncio.sleep(0.01)
    return False


async def _pg_empty(name: str) -> bool:
    import asyncpg

    try:
        admin = await asyncpg.connect(pg_dsn(PG_URL))
        try:
            # (a test may have refused connections to it, or set its defaults)
            await admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true; ALTER DATABASE {name} RESET ALL")
            if not await _pg_sessions_gone(admin, name):
                return False
            db = await asyncpg.connect(pg_dsn(make_url(PG_URL).set(database=name).render_as_string(False)))
            try:
                await db.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
                left = await db.fetchval(_LEFT_OVER)
            finally:
                await db.close()
            return left == 0 and await _pg_sessions_gone(admin, name)
        finally:
            await admin.close()
    except Exception:  # (asyncpg's errors, OSError): not made sure
        return False


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    """A fresh, empty store for this test."""
    if BACKEND == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'agentguard.db'}"
        return
    name = pg_database()
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        pg_database_done(name)


@pytest.fixture
async def make_guard(store_url: str) -> AsyncIterator[Callable[..., Guard]]:
    """Build guards on this test's store; all are closed when the test ends."""
    made: list[Guard] = []

    def make(**kw: Any) -> Guard:
        g = Guard(**kw) if "store" in kw else Guard(kw.pop("url", store_url), **kw)
        made.append(g)
        return g

    yield make
    for g in made:
        await g.aclose()


@pytest.fixture
def python() -> str:
    return sys.executable


class ToolKind:
    """Makes a guarded tool of one kind — async or sync — from a plain implementation, and calls it from async
    test code, so a guarantee test runs for both kinds of tool alike.

    The implementation is a plain function that may block (``threading.Event.wait``, ``time.sleep``) as a
    provider call does. An async tool awaits it on a worker thread (as an async tool awaits I/O: the event
    loop stays free); a sync tool runs it in its caller's thread, and the test calls the sync tool on a worker
    thread, as agent frameworks run sync tools. Both keep the task context (``asyncio.to_thread`` copies it).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def once(self, guard: Guard, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        import functools

        def decorate(impl: Callable[..., Any]) -> Callable[..., Any]:
            if self.name == "async":

                @functools.wraps(impl)
                async def tool(*args: Any, **kwargs: Any) -> Any:
                    return await asyncio.to_thread(impl, *args, **kwargs)

                guarded = guard.once(**options)(tool)
                assert inspect.iscoroutinefunction(guarded)

                async def call(*args: Any, **kwargs: Any) -> Any:
                    return await guarded(*args, **kwargs)
            else:
                guarded = guard.once(**options)(impl)
                assert not inspect.iscoroutinefunction(guarded)

                async def call(*args: Any, **kwargs: Any) -> Any:
                    return await asyncio.to_thread(guarded, *args, **kwargs)

            return call

        return decorate


@pytest.fixture(params=["async", "sync"])
def kind(request: pytest.FixtureRequest) -> ToolKind:
    """The kind of tool a guarantee test runs with: every such test runs for both."""
    return ToolKind(request.param)
