"""DBOS (SQLite system database): a workflow whose worker dies mid-step, recovered by a new process.

The worker is this file run as a script, so both processes register the same workflow code (DBOS recovers
only workflows of the same application version). The provider is a local fake that deduplicates by
Idempotency-Key like Stripe; the store is the suite's store (SQLite file or a Postgres database).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agentguard import Guard, MissingTaskError, task  # noqa: E402
from agentguard.integrations import dbos as dbos_adapter  # noqa: E402
from tests.fake_provider import FakeProvider  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
LEASE = 1.0  # the crashed worker's claim expires this fast, so recovery can take it over


def worker(mode: str, sysdb: str, store: str, provider: str, workflow: str) -> None:
    import httpx
    from dbos import DBOS, SetWorkflowID

    from agentguard import downstream

    guard = Guard(store, lease=LEASE)
    client = httpx.Client(base_url=provider)
    downstream.install(client)
    DBOS(config={"name": "agentguard-dbos-test", "system_database_url": sysdb})

    # The key reaches the provider through the client's hook (downstream.install), not a parameter: say so, and
    # a takeover after the crash runs the body again with it, for the provider to deduplicate.
    @dbos_adapter.once(guard, key="order_id", on_unknown="retry")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        response = client.post("/v1/charges", json={"order_id": order_id, "amount": amount_cents})
        if mode == "crash-in-body":
            os._exit(3)  # the provider charged; nothing was recorded anywhere
        return dict(response.json())

    @DBOS.step()
    def charge_step(order_id: str, amount_cents: int) -> dict[str, Any]:
        receipt = charge(order_id, amount_cents)
        if mode == "crash-after-guard":
            os._exit(3)  # the guard stored the result; DBOS did not record the step
        return receipt

    @DBOS.workflow()
    def checkout(order_id: str, amount_cents: int) -> list[dict[str, Any]]:
        first = charge_step(order_id, amount_cents)
        again = charge_step(order_id, amount_cents)  # the agent re-invoked the tool: a new step, replayed
        return [first, again]

    DBOS.launch()  # recovers the pending workflow of a crashed run, in the background
    if mode == "recover":
        print(json.dumps(DBOS.retrieve_workflow(workflow).get_result()))
    else:
        with SetWorkflowID(workflow):
            checkout("o-1", 4900)
    guard.close()
    sys.stdout.flush()
    os._exit(0)  # skip DBOS.destroy(), which waits about a second for its queue threads; nothing is pending


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def run_worker(mode: str, tmp_path: Path, store_url: str, provider: FakeProvider) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, __file__, mode, f"sqlite:///{tmp_path / 'dbos.sqlite'}", store_url, provider.url, "wf-42"]
    return subprocess.run(args, capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["crash-in-body", "crash-after-guard"])
async def test_workflow_recovered_after_a_crash_charges_once(
    crash: str, tmp_path: Path, store_url: str, provider: FakeProvider, make_guard: Callable[..., Guard]
) -> None:
    died = run_worker(crash, tmp_path, store_url, provider)
    assert died.returncode == 3, died.stderr
    assert len(provider.charges) == 1

    recovered = run_worker("recover", tmp_path, store_url, provider)
    assert recovered.returncode == 0, recovered.stderr
    first, again = json.loads(recovered.stdout.strip().splitlines()[-1])
    assert first == again == provider.charges[0]
    assert len(provider.charges) == 1  # one charge, whatever the crash
    (record,) = await make_guard().records()
    assert record.task_id == "wf-42"  # the DBOS workflow id
    keys = provider.keys("/v1/charges")
    assert set(keys) == {record.key}
    # crash in the body: the recovery took the claim over and sent the same key again (deduplicated there);
    # crash after the guard: the recovery was replayed by the guard and never reached the provider.
    assert len(keys) == (2 if crash == "crash-in-body" else 1)


async def test_dbos_outside_a_workflow_refuses(make_guard: Callable[..., Guard]) -> None:
    runs = []

    @dbos_adapter.once(make_guard())
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        return "ok"

    assert dbos_adapter.workflow_id() is None
    with pytest.raises(MissingTaskError, match="not running inside a DBOS workflow"):
        await charge("o-1")
    async with task("explicit"):
        assert await charge("o-1") == "ok"
    assert runs == ["o-1"]


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(make_guard: Callable[..., Guard]) -> None:
    runs: list[str] = []
    with pytest.raises(TypeError) as info:

        @dbos_adapter.once(make_guard(), key="orderid")
        async def charge(order_id: str, amount_cents: int) -> str:
            runs.append(order_id)
            return "ok"

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id")
    assert runs == []


@pytest.mark.storeless
async def test_a_step_has_no_model_to_tell_of_a_replay(make_guard: Callable[..., Guard]) -> None:
    """A workflow engine's step is replayed as it is (the workflow's code reads it, not a model): the option
    that would tell a model is refused rather than silently ignored; in a task, a replay is the bare value."""
    from agentguard.integrations import temporal as temporal_adapter

    guard = make_guard()
    for adapter in (dbos_adapter, temporal_adapter):
        with pytest.raises(TypeError, match=r"replay_note \(no model to tell\)"):
            adapter.once(guard, replay_note=True)  # type: ignore[call-arg]

    @dbos_adapter.once(guard)
    async def charge(order_id: str) -> str:
        return f"charged {order_id}"

    with task("t-step"):
        assert await charge("o-1") == await charge("o-1") == "charged o-1"


if __name__ == "__main__":
    worker(*sys.argv[1:6])
