"""Multi-step operations: recovery points, unknown outcomes and reconciliation — with real processes
killed (SIGKILL) or frozen (SIGSTOP) at each point, on the suite's backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import text

from agentguard import (
    Guard,
    InProgressError,
    KeyReuseError,
    LeaseLostError,
    Operation,
    OutcomeUnknownError,
    StepOrderError,
    sub_key,
    task,
)
from agentguard.stores import SQLStore

from conftest import raw_exec, tid
from op_worker import RIDES_DDL, Provider, build

pytestmark = pytest.mark.anyio
WORKER = str(Path(__file__).resolve().parents[1] / "op_worker.py")



class Env:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.provider = Provider(str(tmp / "provider.db"))
        self.receipts = tmp / "receipts"
        self.task_id = tid()

    def worker(self, mode: str, policy: str = "retry", *extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, WORKER, self.url, self.task_id, self.provider.path, str(self.receipts), mode, policy,
             *extra],
            stdout=subprocess.PIPE, text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    def killed(self, mode: str, policy: str = "retry", *extra: str) -> None:
        proc = self.worker(mode, policy, *extra)
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL

    def receipts_sent(self) -> list[str]:
        return self.receipts.read_text().splitlines() if self.receipts.exists() else []

    async def rides(self) -> int:
        store = SQLStore(self.url)
        async with Guard(store=store) as g:
            await g.ensure_schema()
            async with store.engine().connect() as conn:
                return int((await conn.execute(text("SELECT COUNT(*) FROM rides"))).scalar_one())


@pytest.fixture
async def env(store_url: str, tmp_path: Path) -> Env:
    await raw_exec(store_url, RIDES_DDL)
    return Env(store_url, tmp_path)


async def test_kill_after_the_first_recovery_point_resumes_after_it(env: Env) -> None:
    env.killed("kill_after_tx")
    assert await env.rides() == 1
    async with Guard(env.url, lease=1.0) as guard:
        book_ride = build(guard, env.provider, str(env.receipts))
        with task(env.task_id):
            receipt = await book_ride("r-1", 2500)  # waits out the dead worker's lease, takes over
            again = await book_ride("r-1", 2500)
        (record,) = await guard.records(task_id=env.task_id)
    assert receipt == again and await env.rides() == 1  # create_ride was skipped, not re-run
    assert env.provider.counts() == (1, 1) and len(env.receipts_sent()) == 1
    (charge_key,) = env.provider.keys()
    assert charge_key == sub_key(record.key, "charge")  # the step's sub-key reached the provider


async def test_kill_inside_the_foreign_call_retry_resends_the_same_sub_key(env: Env) -> None:
    env.killed("kill_in_charge", "retry")
    assert env.provider.counts() == (1, 1)  # the provider charged, the worker never recorded it
    async with Guard(env.url, lease=1.0) as guard:
        book_ride = build(guard, env.provider, str(env.receipts), policy="retry")
        with task(env.task_id):
            receipt = await book_ride("r-1", 2500)
    charges, requests = env.provider.counts()
    keys = env.provider.keys()
    assert (charges, requests) == (1, 2) and keys[0] == keys[1]  # re-sent with the same sub-key: deduplicated
    assert env.provider.find(keys[0]) is not None and receipt.charge_id == env.provider.find(keys[0]).id  # type: ignore[union-attr]
    assert await env.rides() == 1 and len(env.receipts_sent()) == 1


async def test_kill_inside_the_foreign_call_reconcile_asks_the_provider(env: Env) -> None:
    env.killed("kill_in_charge", "reconcile")
    async with Guard(env.url, lease=1.0) as guard:
        book_ride = build(guard, env.provider, str(env.receipts), policy="reconcile")
        with task(env.task_id):
            receipt = await book_ride("r-1", 2500)
    assert env.provider.counts() == (1, 1)  # found by reconcile: the provider was not called again
    assert receipt.charge_id == env.provider.find(env.provider.keys()[0]).id  # type: ignore[union-attr]
    assert len(env.receipts_sent()) == 1


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTGUARD_URL": url}
    return subprocess.run([sys.executable, "-m", "agentguard.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)


async def ledger_says(guard: Guard, task_id: str, after: list[str]) -> None:
    """The attempt ledger: the killed worker's attempt (it went away mid-step), three calls held on the unknown
    step, the operator's resolve, then ``after``."""
    await guard.flush_ledger()
    kinds = [e.kind for e in await guard.timeline(task_id)]
    assert kinds == ["went_away"] + ["unknown"] * 3 + ["resolved"] + after, kinds


@pytest.mark.parametrize("settle", ["result", "retry", "abandon"])
async def test_hold_holds_on_every_retry_until_resolved(env: Env, settle: str) -> None:
    env.killed("kill_in_charge", "hold")
    async with Guard(env.url, lease=1.0) as guard:
        book_ride = build(guard, env.provider, str(env.receipts), policy="hold")
        with task(env.task_id):
            for _ in range(3):
                with pytest.raises(OutcomeUnknownError) as info:
                    await book_ride("r-1", 2500)
                assert info.value.step == "charge" and "agentguard resolve" in str(info.value)
        assert env.provider.counts() == (1, 1) and env.receipts_sent() == []
        key = info.value.key
        assert key is not None
        listed = cli(env.url, "ls", "--unknown")
        assert key in listed.stdout and "step='charge'" in listed.stdout
        if settle == "result":
            real = env.provider.find(env.provider.keys()[0])
            assert real is not None
            out = cli(env.url, "resolve", key, "--result", json.dumps(real.model_dump()))
        else:
            out = cli(env.url, "resolve", key, f"--{settle}")
        assert out.returncode == 0, out.stderr
        assert "no operations" in cli(env.url, "ls", "--unknown").stdout
        with task(env.task_id):
            if settle == "abandon":
                for _ in range(2):
                    with pytest.raises(OutcomeUnknownError, match="abandoned"):
                        await book_ride("r-1", 2500)
                assert env.receipts_sent() == []
                await ledger_says(guard, env.task_id, ["replayed", "replayed"])
                return
            receipt = await book_ride("r-1", 2500)
        await ledger_says(guard, env.task_id, ["ran"])
    charges, requests = env.provider.counts()
    assert charges == 1 and requests == (1 if settle == "result" else 2)
    assert receipt.charge_id == env.provider.find(env.provider.keys()[0]).id  # type: ignore[union-attr]
    assert len(env.receipts_sent()) == 1 and await env.rides() == 1


async def test_kill_between_insert_and_commit_leaves_neither(env: Env) -> None:
    env.killed("kill_in_tx")
    assert await env.rides() == 0  # the user's row and the recovery point: neither committed
    async with Guard(env.url, lease=1.0) as guard:
        book_ride = build(guard, env.provider, str(env.receipts))
        with task(env.task_id):
            await book_ride("r-1", 2500)
    assert await env.rides() == 1 and env.provider.counts() == (1, 1)


async def test_a_resumable_operation_is_completed_by_complete_stalled(env: Env) -> None:
    env.killed("kill_after_tx", "retry", "--resumable")
    async with Guard(env.url, lease=1.0) as guard:
        build(guard, env.provider, str(env.receipts), resumable=True)
        await asyncio.sleep(1.2)  # the dead worker's lease runs out
        outcomes = await guard.complete_stalled()
        assert [o.value.ride_id for o in outcomes] == ["r-1"] and not outcomes[0].replayed
        assert await guard.complete_stalled() == []
    assert await env.rides() == 1 and env.provider.counts() == (1, 1) and len(env.receipts_sent()) == 1


async def test_a_stale_worker_cannot_record_a_step_after_a_takeover(env: Env) -> None:
    proc = env.worker("stop_in_charge", "retry")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stopped"
    try:
        async with Guard(env.url, lease=1.0) as guard:
            book_ride = build(guard, env.provider, str(env.receipts), policy="retry")
            with task(env.task_id):
                winner = await book_ride("r-1", 2500)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    loser = json.loads(out.strip().splitlines()[-1])
    assert loser["error"] == LeaseLostError.__name__
    assert env.provider.counts() == (1, 2) and len(env.receipts_sent()) == 1
    assert winner.charge_id == env.provider.find(env.provider.keys()[0]).id  # type: ignore[union-attr]


class Quote(BaseModel):
    amount: int
    currency: str


async def test_steps_in_another_order_on_a_retry_are_refused(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    ran: list[str] = []
    order = ["reserve", "charge"]

    async def act(name: str) -> str:
        ran.append(name)
        return name

    @guard.once
    async def checkout(cart: str, op: Operation) -> str:
        for name in order:
            await op.step(name, act, name)
            if op.attempt == 1:
                raise ConnectionError("lost the network after the first step")
        return "ok"

    with task(tid()):
        with pytest.raises(ConnectionError):
            await checkout("c-1")
        order.reverse()
        with pytest.raises(StepOrderError, match="same order") as info:
            await checkout("c-1")
        assert info.value.status == 409
        order.reverse()
        assert await checkout("c-1") == "ok"  # the recorded step is skipped, the next one runs
    assert ran == ["reserve", "charge"]


async def test_a_step_name_twice_is_refused(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    @guard.once
    async def twice(op: Operation) -> None:
        await op.step("charge", asyncio.sleep, 0)
        await op.step("charge", asyncio.sleep, 0)

    with task(tid()), pytest.raises(StepOrderError, match="twice"):
        await twice()


async def test_sub_keys_are_per_step_operation_and_task_and_stable(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    seen: list[tuple[str, str, str]] = []

    @guard.once(key=["n"])
    async def op_tool(n: int, op: Operation, idempotency_key: str = "") -> None:
        assert op.downstream_key == idempotency_key
        seen.append((op.key("charge"), op.key("refund"), idempotency_key))
        if len(seen) == 1:
            raise ConnectionError("first attempt fails")

    for t in ("task-a", "task-b"):
        with task(t):
            with pytest.raises(ConnectionError) if t == "task-a" else _nothing():
                await op_tool(1)
            if t == "task-a":
                await op_tool(1)  # a retry: same keys
            await op_tool(2)
    a1, a1_retry, a2, b1, b2 = seen
    assert a1 == a1_retry
    assert a1[0] == sub_key(a1[2], "charge") and a1[0] != a1[1]
    assert len({a1[0], a2[0], b1[0], b2[0]}) == 4


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


async def test_a_step_returning_a_model_resumes_with_its_type(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    calls = 0

    async def quote() -> Quote:
        nonlocal calls
        calls += 1
        return Quote(amount=100, currency="EUR")

    results: list[Any] = []

    @guard.once
    async def price(op: Operation) -> int:
        q = await op.step("quote", quote)
        results.append(q)
        if len(results) == 1:
            raise ConnectionError("later step failed")
        return q.amount

    with task(tid()):
        with pytest.raises(ConnectionError):
            await price()
        assert await price() == 100
    assert calls == 1 and all(type(r) is Quote for r in results) and results[0] == results[1]


async def test_a_step_that_raises_clears_its_mark_and_reruns(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    tries = 0

    async def flaky_charge() -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise TimeoutError("provider timeout")
        return "ch_1"

    @guard.once(on_unknown="hold")
    async def pay(op: Operation) -> str:
        return await op.step("charge", flaky_charge)

    with task(tid()):
        with pytest.raises(TimeoutError):
            await pay()
        assert await pay() == "ch_1"  # not held: a step that raised has a known outcome
    assert tries == 2


async def test_bad_multi_step_options(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    async def tool(op: Operation) -> None: ...

    def sync_tool(op: Operation) -> None: ...

    with pytest.raises(ValueError, match="on_unknown"):
        guard.once(on_unknown="guess")(tool)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="reconcile"):
        guard.once(on_unknown="reconcile")(tool)
    with pytest.raises(TypeError, match="async"):
        guard.once(sync_tool)


# -- the webhook recipe: the provider's event id is the key, a unique index is the belt and braces -----


async def test_webhook_receiver(store_url: str) -> None:
    await raw_exec(store_url, "CREATE TABLE payments (event_id VARCHAR(64) NOT NULL,"
                              " charge_id VARCHAR(64) NOT NULL UNIQUE)")
    async with Guard(store_url, on_conflict="raise") as guard:
        handled: list[str] = []

        @guard.once(operation="stripe_webhook")
        async def handle(event: dict[str, Any], op: Operation) -> str:
            handled.append(event["id"])

            async def record(conn: Any) -> str:
                await conn.execute(text("INSERT INTO payments VALUES (:e, :c)"),
                                   {"e": event["id"], "c": event["data"]["charge"]})
                return "recorded"

            await asyncio.sleep(0.2)  # a slow handler (it fetches the charge): a redelivery arrives meanwhile
            return await op.transaction("record_payment", record)

        async def receive(event: dict[str, Any]) -> int:
            """What the HTTP endpoint answers: 200 done, 409 a delivery in flight, 422 a forged id."""
            try:
                async with task(event["id"], scope="webhooks"):
                    await handle(event)
                return 200
            except InProgressError:
                return 409
            except KeyReuseError:
                return 422

        evt = {"id": "evt_1", "data": {"charge": "ch_1"}}
        assert sorted(await asyncio.gather(receive(evt), receive(evt))) == [200, 409]
        assert await receive(evt) == 200  # a redelivery after it finished: replayed
        assert await receive({"id": "evt_1", "data": {"charge": "ch_2"}}) == 422
        # Another event id for the same charge: the guard cannot know, the unique index does.
        with pytest.raises(Exception, match=r"(?i)unique"):
            await receive({"id": "evt_2", "data": {"charge": "ch_1"}})
    assert handled == ["evt_1", "evt_2"]
