"""The lane (``stores/_lane.py``) when its callers go away: a caller cancelled while it waits in line, one
cancelled just as a connection (or a connection's slot) was handed to it, one cancelled while its connection is
still opening, and a lane closed while its idle connections age. Each must leave no connection and no slot
behind: what was handed on reaches the next caller in line, and the lane's count of the slots it holds stays
true. On the real engine of the suite's backend (a pool with room for the lane), with real tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentguard.stores import _lane
from agentguard.stores._lane import Conn, Lane

pytestmark = pytest.mark.anyio

WAIT = 30.0  # seconds after which a wait of these tests gives up (a failure, never a timing asserted)


@pytest.fixture
async def engine(store_url: str) -> AsyncIterator[AsyncEngine]:
    made = create_async_engine(store_url, pool_size=2, max_overflow=4)
    try:
        yield made
    finally:
        await made.dispose()


async def until(cond: Callable[[], bool]) -> None:
    """Let the loop run until ``cond`` holds (a connection opening in aiosqlite's thread or on the socket)."""
    async with asyncio.timeout(WAIT):
        while not cond():  # noqa: ASYNC110 (what it waits for is the lane's and the driver's: no event to await)
            await asyncio.sleep(0.005)


async def queued(lane: Lane, n: int, *acquiring: Awaitable[Conn]) -> list[asyncio.Task[Conn]]:
    tasks = [asyncio.ensure_future(a) for a in acquiring]
    await until(lambda: len(lane.queue) == n)
    return tasks


async def test_a_caller_cancelled_in_line_leaves_it(engine: AsyncEngine) -> None:
    lane = Lane(1)
    first = await lane.acquire(engine)
    (waiting,) = await queued(lane, 1, lane.acquire(engine))
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert lane.held == 1
    await lane.release(first, sound=True)  # its place in line is passed over
    assert not lane.queue and [c for c, _ in lane.idle] == [first] and lane.held == 1  # kept for the next caller
    assert await lane.acquire(engine) == first
    await lane.release(first, sound=True)
    await lane.close_idle()
    assert lane.held == 0 and not lane.idle


async def test_a_connection_handed_to_a_caller_cancelled_meanwhile_goes_to_the_next_in_line(
        engine: AsyncEngine) -> None:
    lane = Lane(1)
    first = await lane.acquire(engine)
    second, third = await queued(lane, 2, lane.acquire(engine), lane.acquire(engine))
    await lane.release(first, sound=True)  # handed to the second caller, which has not run since
    assert second.cancel()  # ... and goes away before it takes it
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await third == first and lane.held == 1 and not lane.queue and not lane.idle
    await lane.release(first, sound=True)
    await lane.close_idle()
    assert lane.held == 0


async def test_a_slot_handed_to_a_caller_cancelled_meanwhile_goes_to_the_next_in_line(engine: AsyncEngine) -> None:
    """A connection that may be broken goes back to the pool; its slot passes to the caller in line, and on to
    the next if that one went away."""
    lane = Lane(1)
    first = await lane.acquire(engine)
    second, third = await queued(lane, 2, lane.acquire(engine), lane.acquire(engine))
    await lane.release(first, sound=False)  # back to the pool: the second caller is handed the slot
    assert second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    opened = await third  # the slot reached it: it opened a connection with it
    assert lane.held == 1 and not lane.queue
    await lane.release(opened, sound=True)
    await lane.close_idle()
    assert lane.held == 0


async def test_a_place_in_line_left_before_it_was_handed_anything_is_passed_over(engine: AsyncEngine) -> None:
    """A gathered batch takes its place in line when it is formed (``Executor``'s ``Batch``); its task cancelled
    before it ran leaves the place: out of the line, and the connection released next is not handed to it."""
    lane = Lane(1)
    first = await lane.acquire(engine)
    lined = lane.line_up()
    lane.leave(lined)
    assert lined.cancelled() and not lane.queue
    await lane.release(first, sound=True)
    assert [c for c, _ in lane.idle] == [first] and lane.held == 1
    await lane.close_idle()
    assert lane.held == 0


async def test_a_slot_handed_to_a_place_left_meanwhile_goes_to_the_next_in_line(engine: AsyncEngine) -> None:
    """The place was handed a slot (a connection went back to the pool) just as the batch holding it went: the
    slot passes on to the caller waiting behind it, who opens a connection with it."""
    lane = Lane(1)
    first = await lane.acquire(engine)
    lined = lane.line_up()
    (behind,) = await queued(lane, 2, lane.acquire(engine))
    await lane.release(first, sound=False)  # back to the pool: its slot handed to the place
    assert lined.done() and lined.result() is None and not behind.done()
    lane.leave(lined)
    opened = await behind
    assert lane.held == 1 and not lane.queue
    await lane.release(opened, sound=True)
    await lane.close_idle()
    assert lane.held == 0


async def test_a_slot_passes_over_a_caller_that_went_while_in_line(engine: AsyncEngine) -> None:
    """A caller cancelled in line leaves its (cancelled) place there; a slot coming free passes over it to the
    caller behind."""
    lane = Lane(1)
    first = await lane.acquire(engine)
    gone, behind = await queued(lane, 2, lane.acquire(engine), lane.acquire(engine))
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await lane.release(first, sound=False)
    opened = await behind
    assert lane.held == 1 and not lane.queue
    await lane.release(opened, sound=True)
    await lane.close_idle()
    assert lane.held == 0


async def test_a_slot_nobody_waits_for_is_free_again(engine: AsyncEngine) -> None:
    lane = Lane(1)
    first = await lane.acquire(engine)
    (second,) = await queued(lane, 1, lane.acquire(engine))
    await lane.release(first, sound=False)
    assert second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert lane.held == 0 and lane.free()


async def test_a_connection_still_opening_when_its_caller_went_is_kept(engine: AsyncEngine) -> None:
    lane = Lane(2)
    opening = asyncio.ensure_future(lane.acquire(engine))
    await asyncio.sleep(0)  # it runs to the checkout, which goes on without it
    assert opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    await until(lambda: bool(lane.idle))  # opened to the end, and kept for the next caller
    assert lane.held == 1
    await lane.close_idle()
    assert lane.held == 0


async def test_a_connection_that_fails_to_open_after_its_caller_went_frees_its_slot() -> None:
    async def refused() -> object:  # (a connect that fails with no driver thread left behind to outlive the test)
        await asyncio.sleep(0.01)
        raise ConnectionRefusedError("the server is unreachable")

    unreachable = create_async_engine("sqlite+aiosqlite://", async_creator=refused)
    try:
        lane = Lane(1)
        opening = asyncio.ensure_future(lane.acquire(unreachable))
        await asyncio.sleep(0)
        assert opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        await until(lambda: lane.held == 0)
        assert lane.free() and not lane.idle
    finally:
        await unreachable.dispose()


async def test_a_lane_closed_while_connections_age_gives_back_every_one(engine: AsyncEngine,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lane, "IDLE_KEEP", 3600.0)  # none ages during the test, however slow the machine
    lane = Lane(4)
    conns = [await lane.acquire(engine) for _ in range(_lane.IDLE_MIN + 1)]
    for conn in conns:
        await lane.release(conn, sound=True)
    assert len(lane.idle) == _lane.IDLE_MIN + 1 and lane._trimming is not None  # one beyond those kept, timed
    await lane.close_idle()
    assert lane._trimming is None and not lane.idle and lane.held == 0
    assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_a_connection_goes_back_to_the_pool_while_a_caller_waits_there(store_url: str) -> None:
    """A caller blocked in the pool's own queue is served by the pool, in its order: a connection the lane is
    done with goes back there, not to the lane's idle list — also when released without awaiting, and when the
    lane is closed just then."""
    engine = create_async_engine(store_url, pool_size=1, max_overflow=1, pool_timeout=WAIT)
    try:
        async with engine.connect():  # the general path holds one of the pool's two
            lane = Lane(2)
            first = await lane.acquire(engine)
            second = asyncio.ensure_future(lane.acquire(engine))
            await until(lambda: lane.waiting == 1)  # the pool is exhausted: it waits in the pool's queue
            lane.release_now(first)  # given back in a task of the lane's
            await lane.close_idle()  # ... which closing waits for
            got = await second
            assert got[1] is first[1] and lane.held == 1 and not lane.idle and lane.waiting == 0
            await lane.release(got, sound=False)
            assert lane.held == 0
    finally:
        await engine.dispose()
