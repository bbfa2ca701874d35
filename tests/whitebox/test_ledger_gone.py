"""Every attempt kept: a worker SIGKILLed mid-call dies with its queue of ledger entries, and its attempt is in the
ledger anyway — read from its record once its lease ran out, then written by whoever takes it over or settles it —
in ``timeline``, ``stats`` and the console; and a process reads its own entries at once (read-your-writes), on the
suite's backend."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from agentguard import Guard, task
from agentguard._lease import HOST_MAX
from agentguard.console._timeline import rows_of_attempts, svg
from agentguard.stores import Attempt

from conftest import tid
from console_server import console
from workers import Worker, effects_of, release_together

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

T = TypeVar("T")


def named(pid: int) -> str:
    """``host:pid`` as the ledger names a process (``_lease.process_name``)."""
    host = socket.gethostname()
    if len(host) > HOST_MAX:
        host = host.split(".")[0][:HOST_MAX]
    return f"{host}:{pid}"


async def until(read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """``read()`` again until ``done`` says so (a lease running out, a writer in another process): the outcome
    is asserted, never how long it took; a generous bound only ends a test that would hang."""
    for _ in range(600):
        got = await read()
        if done(got):
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"never came: last read {got!r}")


def story(entries: list[Attempt]) -> list[tuple[str, int]]:
    return [(e.kind, e.attempt) for e in entries]


def killed_inside_the_body(store_url: str, t: str, effects: Path, **opts: Any) -> int:
    """A worker process that claimed the charge and is SIGKILLed inside its body: its pid."""
    victim = Worker(store_url, t, effects, "hang", lease=1.0, sleep=120, **opts)
    release_together([victim])
    victim.expect("started")
    victim.kill()
    return victim.proc.pid


async def test_a_worker_killed_mid_call_is_kept_as_gone_then_taken_over(store_url: str, tmp_path: Path) -> None:
    t, effects = tid(), tmp_path / "effects"
    dead = killed_inside_the_body(store_url, t, effects)
    async with Guard(store_url, lease=1.0) as guard:
        # Nothing of the dead worker's was written (its queue died with it); once its lease ran out, its record
        # says the attempt went away, and every reader shows it so.
        entries = await until(lambda: guard.timeline(t), lambda es: bool(es))
        assert story(entries) == [("went_away", 1)]
        gone = entries[0]
        assert gone.id == 0 and gone.process == named(dead) and gone.tool == "charge"
        assert "lease ran out" in gone.detail and "still running" in gone.detail
        assert await guard.attempts(task_id=t) == entries
        [charge] = await guard.stats()
        assert charge["went_away"] == 1 and charge["calls"] == 1
        picture = svg(rows_of_attempts([], entries, time.time(), lambda key: f"/record?key={key}"), title=t)
        assert "worker went away" in picture and "attempt 1: went away" in picture  # (the console's timeline)
        with console(store_url, tmp_path / "console.log") as c:  # the console, a process of its own
            async with httpx.AsyncClient(base_url=c.base, timeout=60) as client:
                page = (await client.get(f"/task?scope=default&id={t}")).text
        assert "worker went away" in page  # the timeline's mark and legend
        assert '<span class="kind">went away</span>' in page and named(dead) in page  # the table of attempts

        # A survivor takes it over (its key reaches the provider): it writes the gone attempt's entry with its
        # own, and the record no longer stands for it (one entry, not two).
        survivor = Worker(store_url, t, effects, "once", lease=1.0)
        release_together([survivor])
        assert survivor.result()["ok"]["pid"] == survivor.proc.pid
        entries = await until(lambda: guard.timeline(t), lambda es: len(es) >= 2)
        assert story(entries) == [("went_away", 1), ("took_over", 2)]
        assert entries[0].id > 0 and entries[0].process == named(dead)
        assert "taken over by attempt 2" in entries[0].detail
        assert entries[1].process == named(survivor.proc.pid)
        [charge] = await guard.stats()
        assert (charge["went_away"], charge["took_over"], charge["calls"]) == (1, 1, 2)
    assert len(set(effects_of(effects))) == 1  # one downstream key for both runs


async def test_a_held_attempt_is_kept_until_an_operator_settles_it(store_url: str, tmp_path: Path) -> None:
    t, effects = tid(), tmp_path / "effects"
    dead = killed_inside_the_body(store_url, t, effects, keyless=True)
    async with Guard(store_url, lease=1.0) as guard:
        await until(lambda: guard.timeline(t), lambda es: bool(es))
        # Its key cannot reach the provider: the next call is held for a person, not run.
        asker = Worker(store_url, t, effects, "once", lease=1.0, keyless=True)
        release_together([asker])
        assert asker.result()["error"] == "OutcomeUnknownError"
        entries = await until(lambda: guard.timeline(t), lambda es: len(es) >= 2)
        assert [e.kind for e in entries] == ["went_away", "unknown"]
        assert entries[0].id == 0 and "lease ran out inside the body" in entries[0].detail
        assert entries[0].detail.endswith("from its record, held for a person")
        [held] = await guard.unknown()
        assert await guard.resolve(held["key"], result={"order_id": "o-1", "settled": True}) == "its result recorded"
        entries = await guard.timeline(t)
        assert [e.kind for e in entries] == ["unknown", "went_away", "resolved"]
        written = [e for e in entries if e.kind == "went_away"]
        assert len(written) == 1 and written[0].id > 0 and written[0].process == named(dead)
        assert written[0].attempt == 1 and "settled by an operator: its result recorded" in written[0].detail
    assert len(effects_of(effects)) == 1


async def test_a_process_reads_its_own_entries_at_once_and_another_within_the_writers_interval(
    make_guard: Callable[..., Guard],
) -> None:
    writer, reader = make_guard(), make_guard(ledger=False)  # two guards: two ledgers, as two processes have
    t = tid()

    @writer.once(key=["order"])
    async def charge(order: str) -> str:
        return order

    with task(t):
        await charge("o-1")
        await charge("o-1")
    # Read-your-writes: no flush_ledger(), no wait; what this guard queued is written before it reads.
    assert story(await writer.timeline(t)) == [("ran", 1), ("replayed", 1)]
    [stats] = await writer.stats()
    assert stats["calls"] == 2
    with task(t):
        await charge("o-2")
    # Another reader sees it once the writer's interval passed (``_ledger.INTERVAL``).
    got = await until(lambda: reader.timeline(t), lambda es: len(es) == 3)
    assert [e.kind for e in got] == ["ran", "replayed", "ran"]
