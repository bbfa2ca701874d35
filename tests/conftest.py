"""One suite, both databases. ``AGENTGUARD_TEST_BACKEND=sqlite|postgres`` picks the store; with postgres,
``AGENTGUARD_TEST_PG_URL`` points at a server (``scripts/test.sh`` starts a throwaway one). Each test gets its
own SQLite file or its own Postgres database, so tests never see each other's records."""

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
# are left out, and said so (tests/test_examples.py).
OWN_VIRTUALENV = {"strands": "test_integration_strands.py", "crewai": "test_integration_crewai.py"}
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
    for item in items:
        if "postgres" in item.keywords and BACKEND != "postgres":
            item.add_marker(skip)


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


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    """A fresh, empty store for this test."""
    if BACKEND == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'agentguard.db'}"
        return
    name = "t_" + uuid.uuid4().hex[:20]
    asyncio.run(_pg_admin(f"CREATE DATABASE {name}"))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


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
