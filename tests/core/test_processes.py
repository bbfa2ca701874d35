"""The guarantee across separate OS processes: barriers, SIGKILL and SIGSTOP, on the suite's backend."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, LeaseLostError, task

from workers import Worker, effects_of, killed_mid_body, release_together, survive

pytestmark = pytest.mark.slow

@pytest.mark.parametrize("on_conflict", ["wait", "raise"])
def test_eight_processes_one_key_one_side_effect(store_url: str, tmp_path: Path, on_conflict: str) -> None:
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    workers = [Worker(store_url, t, effects, "once", on_conflict=on_conflict, sleep=0.5) for _ in range(8)]
    release_together(workers)
    results = [w.result() for w in workers]
    assert len(effects_of(effects)) == 1
    oks = [r["ok"] for r in results if "ok" in r]
    assert oks and all(o == oks[0] for o in oks)
    if on_conflict == "wait":
        assert len(oks) == 8
    else:
        assert {r["error"] for r in results if "error" in r} <= {"InProgressError"}


def test_sigkill_mid_call_is_taken_over_with_the_same_key(store_url: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    victim = Worker(store_url, t, effects, "hang", lease=1.0, sleep=60)
    release_together([victim])
    victim.expect("started")
    victim.kill()
    survivor = Worker(store_url, t, effects, "once", lease=1.0)
    release_together([survivor])
    result = survivor.result()["ok"]
    keys = effects_of(effects)
    # The body ran twice (once per live claim) with one downstream key: the provider deduplicates.
    assert len(keys) == 2 and keys[0] == keys[1] == result["key"]
    assert result["pid"] == survivor.proc.pid


@pytest.mark.anyio
@pytest.mark.parametrize("reclaimed_in_between", [False, True])
async def test_stale_worker_woken_after_takeover_gets_lease_lost(
    store_url: str, tmp_path: Path, reclaimed_in_between: bool
) -> None:
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    stale = Worker(store_url, t, effects, "hang", lease=1.0, sleep=1.5)
    release_together([stale])
    stale.expect("started")
    stale.proc.send_signal(signal.SIGSTOP)
    try:
        async with Guard(store_url, lease=1.0) as guard:
            runs: list[str] = []

            @guard.once(key=["order_id"])
            async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
                runs.append(idempotency_key)
                if reclaimed_in_between and len(runs) == 1:
                    raise ConnectionError("first takeover fails and releases its claim")
                return {"order_id": order_id, "amount_cents": amount_cents, "pid": 0, "key": idempotency_key}

            with task(t):
                await asyncio.sleep(1.2)  # the stopped worker's lease runs out
                if reclaimed_in_between:
                    with pytest.raises(ConnectionError):
                        await charge("o-1", 4900)
                winner = await charge("o-1", 4900)
    finally:
        stale.proc.send_signal(signal.SIGCONT)
    loser = stale.result()
    assert loser["error"] == LeaseLostError.__name__ and "took over" in loser["message"]
    # The takeover's result stands: a fresh caller replays it.
    async with Guard(store_url) as guard:

        @guard.once(key=["order_id"], operation="charge")
        async def charge2(order_id: str, amount_cents: int) -> dict[str, Any]:
            raise AssertionError("must replay, not run")

        with task(t):
            assert await charge2("o-1", 4900) == winner
    assert len(set(effects_of(effects) + runs)) == 1  # every attempt used the same downstream key


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["async", "sync"])
async def test_sigkill_mid_body_of_a_tool_whose_key_cannot_reach_the_provider_is_held(
    store_url: str, tmp_path: Path, tool: str
) -> None:
    """Issue 29, item 3. A tool that takes no injected key (nothing tells the provider it is the same charge)
    used to be taken over after the lease and run again: a second charge. Now the dead worker's call is held:
    later callers get OutcomeUnknownError without running it, until a person settles it."""
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    opts: dict[str, Any] = {"keyless": True, **({"sync": True} if tool == "sync" else {})}
    killed_mid_body(store_url, t, effects, **opts)
    for _ in range(2):  # (the second: after the first refused, the record is still held, not taken)
        out = survive(store_url, t, effects, **opts)
        assert out["error"] == "OutcomeUnknownError", out
        assert "went away inside the body" in out["message"] and "agentguard resolve" in out["message"]
    assert len(effects_of(effects)) == 1
    async with Guard(store_url) as guard:
        (held,) = await guard.unknown()
        assert held["held"] == "body" and held["task_id"] == t and held["step"] is None
        settled = {"order_id": "o-1", "amount_cents": 4900, "pid": 0, "key": effects_of(effects)[0]}
        assert await guard.resolve(held["key"], result=settled) == "its result recorded"
        assert await guard.unknown() == []
    assert survive(store_url, t, effects, **opts)["ok"] == settled  # the settled outcome, replayed
    assert len(effects_of(effects)) == 1


@pytest.mark.parametrize("on_unknown", ["hold", "retry"])
def test_sigkill_mid_body_under_guard_run_follows_its_on_unknown(
    store_url: str, tmp_path: Path, on_unknown: str
) -> None:
    """``Guard.run`` (the adapters that guard a framework's tool object): held by default, retried with the
    same key when the caller says the key reaches the provider."""
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    opts: dict[str, Any] = {"run": True, "on_unknown": on_unknown}
    killed_mid_body(store_url, t, effects, **opts)
    out = survive(store_url, t, effects, **opts)
    keys = effects_of(effects)
    if on_unknown == "hold":
        assert out["error"] == "OutcomeUnknownError" and len(keys) == 1
    else:
        assert len(keys) == 2 and keys[0] == keys[1] == out["ok"]["key"]


@pytest.mark.parametrize("tool", ["async", "sync"])
@pytest.mark.parametrize("how", ["injected key", "on_unknown=retry", "on_unknown=reconcile"])
def test_sigkill_mid_body_is_taken_over_where_the_key_reaches_the_provider(
    store_url: str, tmp_path: Path, tool: str, how: str
) -> None:
    """The tool takes the injected key (or says its key reaches the provider): a takeover runs the body again
    with the same key, for the provider to deduplicate; with reconcile, the provider is asked first and the
    body does not run."""
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    opts: dict[str, Any] = {"sync": True} if tool == "sync" else {}
    if how != "injected key":
        opts.update(keyless=True, on_unknown=how.removeprefix("on_unknown="))
    killed_mid_body(store_url, t, effects, **opts)
    out = survive(store_url, t, effects, **opts)["ok"]
    keys = effects_of(effects)
    if how == "on_unknown=reconcile":
        assert out == {"reconciled": keys[0], "step": "charge", "attempt": 2} and len(keys) == 1
    else:
        assert len(keys) == 2 and keys[0] == keys[1] == out["key"]
