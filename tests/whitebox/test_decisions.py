"""Issue 32, item 3: a person's decision (``Guard.resolve``, ``agentguard resolve``) bound to the revision of the
record the person saw. A decision on a record that changed meanwhile is refused, saying what changed; the same
decision sent twice (or by two people, or at once from many processes) is made once, and the second answer is
"already applied". Held outcomes are made for real: a worker SIGKILLed inside a step or inside the body, a
result that could not be stored; on the suite's backend (SQLite and Postgres).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, RecordChangedError, ResultNotStoredError, task
from agentguard.stores import SQLStore
from agentguard.stores import _console as views
from agentguard.stores._decisions import parse_revision

from console_server import held, seed, seeded
from workers import killed_mid_body, survive

pytestmark = pytest.mark.slow


async def record_of(store_url: str, key: str) -> views.RecordRow:
    store = SQLStore(store_url)
    try:
        _, found = await views.record(store, "default", key)
    finally:
        await store.dispose()
    assert found is not None
    return found


def state_of(r: views.RecordRow) -> Any:
    """A record as the store holds it, values included: to compare before and after a refusal."""
    return r.state, r.fence, r.updated, r.held_kind, r.result, [(s.name, s.state, s.result) for s in r.steps]


async def resolved(guard: Guard, key: str) -> list[str]:
    """The operators' acts on ``key`` in the ledger."""
    return [a.detail for a in await guard.attempts(key=key) if a.kind == "resolved"]


async def unstorable(store_url: str) -> tuple[str, list[int], Any]:
    """A record held on its body: it ran, and its result could not be stored. Returns its key, the runs of
    its body, and a call of it."""
    runs: list[int] = []
    t = "t-" + uuid.uuid4().hex[:10]

    async def count(amount: int) -> int:
        runs.append(amount)
        return "not an int" if len(runs) == 1 else amount  # type: ignore[return-value]

    async def call() -> Any:
        async with Guard(store_url) as guard:
            with task(t):
                return await guard.once(operation="count")(count)(7)

    with pytest.raises(ResultNotStoredError):
        await call()
    async with Guard(store_url) as guard:
        (h,) = [u for u in await guard.unknown() if u["task_id"] == t]
    assert h["held"] == "not_stored"
    return h["key"], runs, call


@pytest.mark.anyio
async def test_a_decision_on_a_step_that_changed_meanwhile_is_refused_and_the_same_one_is_made_once(
    store_url: str,
) -> None:
    key = await asyncio.to_thread(lambda: seeded(store_url, done=())["t-held"])  # SIGKILLed inside its step
    async with Guard(store_url) as guard:
        (h,) = await guard.unknown()
        seen = h["revision"]
        assert h["step"] == "charge" and seen == (await record_of(store_url, key)).revision
        assert parse_revision(seen).held == "step"
        # two people look at the same revision; the first clears the step for a retry
        assert await guard.resolve(key, retry=True, revision=seen) == "step 'charge' cleared for a retry"
        after = state_of(await record_of(store_url, key))
        # the second's other decision, made on what they saw, is refused: it says what changed, and by whom
        with pytest.raises(RecordChangedError) as info:
            await guard.resolve(key, result={"id": "ch_guess"}, revision=seen)
        assert "another operator cleared its step for a retry" in str(info.value)
        assert "nothing was changed" in str(info.value) and info.value.seen == seen
        assert info.value.revision == (await record_of(store_url, key)).revision != seen
        # the first's decision sent again is made once: "already applied", nothing written, no second entry
        again = await guard.resolve(key, retry=True, revision=seen)
        assert again.startswith("already applied") and "nothing was changed" in again
        assert state_of(await record_of(store_url, key)) == after
        assert await resolved(guard, key) == ["step 'charge' cleared for a retry"]
    answer = json.loads((await asyncio.to_thread(seed, store_url, "resume", "t-held")).stdout)
    assert answer["ok"]["charge"]["id"] != "ch_guess"  # the retry stood: the step ran again
    async with Guard(store_url) as guard:
        with pytest.raises(RecordChangedError, match="it was claimed again meanwhile"):
            await guard.resolve(key, abandon=True, revision=seen)


@pytest.mark.anyio
@pytest.mark.parametrize("first", ["result", "retry", "abandon"])
async def test_a_decision_on_a_body_that_changed_meanwhile_says_what_changed(store_url: str, first: str) -> None:
    key, runs, call = await unstorable(store_url)
    says = {"result": "another operator recorded a result",
            "retry": "another operator cleared it for a retry: it was released meanwhile",
            "abandon": "another operator abandoned it"}
    decisions: dict[str, dict[str, Any]] = {"result": {"result": 42}, "retry": {"retry": True},
                                            "abandon": {"abandon": True}}
    async with Guard(store_url) as guard:
        seen = (await record_of(store_url, key)).revision
        await guard.resolve(key, revision=seen, **decisions[first])
        after = state_of(await record_of(store_url, key))
        for other in decisions.keys() - {first}:
            with pytest.raises(RecordChangedError, match=says[first]):
                await guard.resolve(key, revision=seen, **decisions[other])
        assert (await guard.resolve(key, revision=seen, **decisions[first])).startswith("already applied")
        assert state_of(await record_of(store_url, key)) == after and len(await resolved(guard, key)) == 1
    if first == "abandon":
        with pytest.raises(Exception, match="abandoned"):
            await call()
    else:
        assert await call() == (42 if first == "result" else 7)
    assert runs == ([7] if first != "retry" else [7, 7])


@pytest.mark.parametrize("same", [True, False], ids=["the same decision", "different decisions"])
def test_decisions_sent_at_once_from_many_processes_are_made_once(store_url: str, same: bool) -> None:
    """Six guards (each its own engine and connections, in threads of their own) send a decision on the same
    revision at the same moment: one is made; the others are answered "already applied" (the same decision)
    or refused with what changed (another)."""
    key, _, _ = asyncio.run(unstorable(store_url))
    seen = asyncio.run(record_of(store_url, key)).revision
    barrier = threading.Barrier(6)
    answers: list[str] = [""] * 6

    def decide(i: int) -> None:
        kwargs: dict[str, Any] = {"result": 40 + i} if not same and i % 2 else {"retry": True}

        async def go() -> str:
            async with Guard(store_url) as guard:
                await guard.ensure_schema()
                barrier.wait()
                try:
                    return await guard.resolve(key, revision=seen, **kwargs)
                except RecordChangedError as exc:
                    return f"refused: {exc}"

        answers[i] = asyncio.run(go())

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    made = [a for a in answers if not a.startswith(("already applied", "refused"))]
    assert len(made) == 1, answers
    if same:
        assert sorted(answers) == sorted([made[0]] + ["already applied: " + made[0] + "; nothing was changed"] * 5)
    else:
        assert all(a.startswith("refused") or a.startswith("already applied") or a == made[0] for a in answers)

    async def entries() -> list[str]:
        async with Guard(store_url) as guard:
            return await resolved(guard, key)

    assert asyncio.run(entries()) == made  # one operator's act in the ledger


@pytest.mark.anyio
async def test_a_hold_mark_changes_the_revision_though_not_the_fence(store_url: str, tmp_path: Path) -> None:
    """A caller that finds the worker gone inside the body of a tool whose key cannot reach the provider marks
    the record held, and changes nothing else (not the fence, not its last change): a decision made on what
    was seen before the mark is refused all the same."""
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    key = None
    await asyncio.to_thread(killed_mid_body, store_url, t, effects, keyless=True)
    async with Guard(store_url) as guard:
        for _ in range(600):  # until the lease (1 s, by the database's clock) ran out: one read a look
            (listed,) = await guard.records(task_id=t)
            key = listed.key
            if listed.lease_left is not None and listed.lease_left <= 0:
                break
            await asyncio.sleep(0.1)
        assert key is not None
        before = await record_of(store_url, key)
        assert not before.live and not before.held and await guard.unknown() == []
        out = await asyncio.to_thread(survive, store_url, t, effects, keyless=True)
        assert out["error"] == "OutcomeUnknownError"  # ... and the record is marked held
        marked = await record_of(store_url, key)
        assert (marked.fence, marked.updated, marked.held_kind) == (before.fence, before.updated, "body")
        with pytest.raises(RecordChangedError, match="it was marked held meanwhile"):
            await guard.resolve(key, abandon=True, revision=before.revision)
        assert await guard.resolve(key, abandon=True, revision=marked.revision) == "abandoned"


@pytest.mark.anyio
async def test_a_revision_that_is_not_one_is_refused_before_anything(store_url: str) -> None:
    key, _, _ = await unstorable(store_url)
    before = state_of(await record_of(store_url, key))
    async with Guard(store_url) as guard:
        for bad in ("", "7", "x.1.running.-.-", "7.1.sideways.-.-", "7.1.running.step.XYZ", "7.1.running.-.-.-"):
            with pytest.raises(ValueError, match="is not a record's revision"):
                await guard.resolve(key, retry=True, revision=bad)
        with pytest.raises(RecordChangedError, match="it is gone"):
            await guard.resolve("ag_" + "0" * 48, retry=True, revision="7.1.running.body.-")
    assert state_of(await record_of(store_url, key)) == before


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentguard.cli", *args, "--url", url], capture_output=True,
                          text=True, timeout=120)


def test_the_command_prints_the_revision_and_resolve_is_bound_to_it(store_url: str) -> None:
    key = seeded(store_url, done=())["t-held"]
    listed = cli(store_url, "ls", "--unknown", "--json")
    (row,) = json.loads(listed.stdout)["unknown"]
    seen = row["revision"]
    assert row["key"] == key and f"revision={seen}" in cli(store_url, "ls", "--unknown").stdout
    first = cli(store_url, "resolve", key[:12], "--retry", "--revision", seen)
    assert first.returncode == 0 and first.stdout.strip() == "step 'charge' cleared for a retry", first.stderr
    again = cli(store_url, "resolve", key, "--retry", "--revision", seen)
    assert again.returncode == 0 and again.stdout.startswith("already applied"), again.stderr
    other = cli(store_url, "resolve", key, "--abandon", "--revision", seen)
    assert other.returncode == 1 and "changed since revision" in other.stderr and "Traceback" not in other.stderr
    assert "another operator cleared its step for a retry" in other.stderr
    bad = cli(store_url, "resolve", key, "--abandon", "--revision", "yesterday")
    assert bad.returncode == 1 and "is not a record's revision" in bad.stderr
    assert held(store_url) == {}


@pytest.mark.anyio
@pytest.mark.parametrize("decision", ["result", "retry"])
async def test_a_record_held_on_its_body_is_settled_while_another_is_held_on_a_step(
    store_url: str, tmp_path: Path, decision: str,
) -> None:
    """The settling statement tells a record's own started steps from those of other records: a record held on
    its body is settled as the person says while another record of the store is held on a step. (Its test of
    started steps once compared each step's columns with themselves, so any started step anywhere made every
    dead record "held on a step", and the decision was refused.)"""
    on_step = await asyncio.to_thread(lambda: seeded(store_url, done=())["t-held"])  # a started step, elsewhere
    effects = tmp_path / "effects"
    t = "t-" + uuid.uuid4().hex[:10]
    await asyncio.to_thread(killed_mid_body, store_url, t, effects, keyless=True)
    async with Guard(store_url) as guard:
        for _ in range(600):  # until the lease (1 s, by the database's clock) ran out: one read a look
            (listed,) = await guard.records(task_id=t)
            if listed.lease_left is not None and listed.lease_left <= 0:
                break
            await asyncio.sleep(0.1)
        out = await asyncio.to_thread(survive, store_url, t, effects, keyless=True)
        assert out["error"] == "OutcomeUnknownError"  # ... and the record is marked held on its body
        marked = await record_of(store_url, listed.key)
        assert marked.held_kind == "body" and (await record_of(store_url, on_step)).held_kind == "step"
        args: dict[str, Any] = {"result": {"ok": True}} if decision == "result" else {"retry": True}
        assert await guard.resolve(listed.key, revision=marked.revision, **args) == (
            "its result recorded" if decision == "result" else "cleared for a retry: its next call runs it again")
        settled = await record_of(store_url, listed.key)
    assert settled.state == ("succeeded" if decision == "result" else "released") and not settled.held_kind
    assert (await record_of(store_url, on_step)).held_kind == "step"  # (the other is left as it was)
