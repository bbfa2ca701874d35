"""The semantics table of the core guard, row by row, on the backend the suite runs against."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import gc
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

import agentguard
from agentguard import (
    Guard,
    GuardError,
    GuardEvent,
    InProgressError,
    KeyReuseError,
    MissingTaskError,
    current_key,
    task,
)

from conftest import ToolKind, tid

pytestmark = pytest.mark.anyio


class Charge(BaseModel):
    id: str
    amount: Decimal
    at: dt.datetime


class CardDeclined(Exception):
    pass



async def test_public_api_is_exactly_this() -> None:
    assert agentguard.__all__ == sorted(agentguard.__all__)
    assert set(agentguard.__all__) == {
        "INJECTED", "Guard", "GuardError", "GuardEvent", "InProgressError", "KeyReuseError", "LeaseLostError",
        "MissingTaskError", "Operation", "OutcomeUnknownError", "Outcome", "RecordChangedError", "ResultNotStoredError",
        "StepOrderError", "StoreError",
        "__version__", "current_audit", "current_key", "current_task", "sub_key", "task",
    }
    for name in agentguard.__all__:
        assert hasattr(agentguard, name)


async def test_first_call_runs_and_returns_the_decoded_stored_value(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    guard = make_guard()
    runs: list[str] = []

    @kind.once(guard, key=["order_id"])
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> Charge:
        runs.append(idempotency_key)
        # A dict, not a Charge: the caller still gets what replays will get, a Charge.
        return {"id": "ch_1", "amount": "49.00", "at": "2026-12-01T10:00:00+00:00"}  # type: ignore[return-value]

    with task(tid()):
        first = await charge("o-1", 4900)
        again = await charge("o-1", 4900)
    assert isinstance(first, Charge) and isinstance(again, Charge)
    assert first == again and first.amount == Decimal("49.00")
    assert len(runs) == 1


async def test_replay_does_not_run_the_body_and_is_reported(
    make_guard: Callable[..., Guard], caplog: pytest.LogCaptureFixture, kind: ToolKind
) -> None:
    events: list[GuardEvent] = []
    guard = make_guard(on_event=events.append)
    runs = 0

    @kind.once(guard)
    def send_email(to: str) -> str:
        nonlocal runs
        runs += 1
        return f"sent:{runs}"

    t = tid()
    with caplog.at_level(logging.INFO, logger="agentguard"), task(t):
        results = [await send_email("a@example.com") for _ in range(3)]
    assert results == ["sent:1"] * 3 and runs == 1
    replays = [e for e in events if e.kind == "replayed"]
    assert len(replays) == 2 and all(e.task_id == t and e.operation == "send_email" for e in replays)
    assert sum("replayed send_email" in r.getMessage() for r in caplog.records) == 2


async def test_same_key_different_arguments_is_a_reuse_error(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    guard = make_guard()
    runs = 0

    @kind.once(guard, key=["order_id"], ignore=["memo"])
    def charge(order_id: str, amount_cents: int, memo: str = "") -> int:
        nonlocal runs
        runs += 1
        return amount_cents

    with task(tid()):
        assert await charge("o-1", 4900, memo="first") == 4900
        assert await charge("o-1", 4900, memo="ignored text differs") == 4900  # memo is not fingerprinted
        with pytest.raises(KeyReuseError) as info:
            await charge("o-1", 5000)
        assert await charge("o-2", 5000) == 5000  # another order is another operation
    err = info.value
    assert err.status == 422 and err.differing == ("amount_cents",)
    assert 'charge[order_id="o-1"]' in str(err) and "amount_cents" in str(err) and "not run" in str(err)
    assert err.operation == 'charge[order_id="o-1"]'
    assert runs == 2


async def test_flat_and_general_arguments_meet_the_same_record(make_guard: Callable[..., Guard]) -> None:
    """Flat arguments (str/int/bool/None) take a one-pass identity; others the general encoder. Both must
    give the pinned key and fingerprint, so ``4900.0`` replays the call made with ``4900`` and a reuse error
    still names the argument that differs."""
    guard = make_guard()
    seen: list[str] = []

    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount_cents: Any, idempotency_key: str = "") -> str:
        seen.append(idempotency_key)
        return idempotency_key

    pinned = "ag_6739037c5c0f63e2a13c8498e81181094263933a7a46164b"  # tests/whitebox/test_whitebox_keys.py
    with task("ticket-8812", scope="acct_42"):
        assert await charge("o-1", 4900) == pinned  # flat
        assert await charge("o-1", 4900.0) == pinned  # general path (a float), the same record: a replay
        with pytest.raises(KeyReuseError) as info:  # a Decimal is typed in the fingerprint: another value
            await charge(order_id="o-1", amount_cents=Decimal("4900"))
    assert info.value.differing == ("amount_cents",)
    assert seen == [pinned]
    records = await guard.records(scope="acct_42")
    assert [r.operation for r in records] == ['charge[order_id="o-1"]']


async def test_no_task_is_refused_before_the_body(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    @guard.once
    async def refund(charge_id: str) -> None:
        nonlocal runs
        runs += 1

    @guard.once
    def refund_sync(charge_id: str) -> None:
        nonlocal runs
        runs += 1

    with pytest.raises(MissingTaskError) as info:
        await refund("ch_1")
    assert info.value.status == 400 and "task" in str(info.value)
    with pytest.raises(MissingTaskError):
        await asyncio.to_thread(refund_sync, "ch_1")
    assert runs == 0


async def test_concurrent_duplicate_waits_and_gets_the_stored_result(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    guard = make_guard(on_conflict="wait")
    runs = 0
    started, finish = threading.Event(), threading.Event()

    @kind.once(guard)
    def charge(amount: int) -> dict[str, int]:
        nonlocal runs
        runs += 1
        started.set()
        assert finish.wait(30)
        return {"amount": amount, "run": runs}

    with task(tid()):
        first = asyncio.create_task(charge(5))
        assert await asyncio.to_thread(started.wait, 30)
        second = asyncio.create_task(charge(5))
        await asyncio.sleep(0.2)
        assert not second.done()  # waiting on the live claim, not running the body
        finish.set()
        assert await first == await second == {"amount": 5, "run": 1}
    assert runs == 1


async def test_concurrent_duplicate_raise_mode_and_wait_timeout(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    guard = make_guard(on_conflict="raise")
    waiter = make_guard(on_conflict="wait", wait_timeout=0.3)
    started, finish = threading.Event(), threading.Event()

    def body(amount: int) -> int:
        started.set()
        assert finish.wait(30)
        return amount

    charge = kind.once(guard, operation="charge")(body)
    charge_wait = kind.once(waiter, operation="charge")(body)
    with task(tid()):
        first = asyncio.create_task(charge(5))
        assert await asyncio.to_thread(started.wait, 30)
        with pytest.raises(InProgressError) as info:
            await charge(5)
        assert info.value.status == 409 and "did not run" in str(info.value)
        with pytest.raises(InProgressError) as waited:
            await charge_wait(5)
        assert "waited" in str(waited.value)
        finish.set()
        assert await first == 5
        assert await charge(5) == 5 and await charge_wait(5) == 5


async def test_waiter_runs_the_body_itself_when_the_first_releases(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    guard = make_guard()
    keys: list[str] = []
    started, fail = threading.Event(), threading.Event()

    @kind.once(guard)
    def charge(amount: int, idempotency_key: str = "") -> int:
        keys.append(idempotency_key)
        if len(keys) == 1:
            started.set()
            assert fail.wait(30)
            raise ConnectionError("provider timed out")
        return amount

    with task(tid()):
        first = asyncio.create_task(charge(7))
        assert await asyncio.to_thread(started.wait, 30)
        second = asyncio.create_task(charge(7))
        await asyncio.sleep(0.1)
        fail.set()
        with pytest.raises(ConnectionError):
            await first
        assert await second == 7
    assert len(keys) == 2 and keys[0] == keys[1]


async def test_cached_errors_replay_as_the_same_class_and_message(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    guard = make_guard()
    runs = 0

    @kind.once(guard, cache_errors=(CardDeclined,))
    def charge(amount: int) -> int:
        nonlocal runs
        runs += 1
        raise CardDeclined(f"card declined: insufficient funds for {amount}")

    with task(tid()):
        for _ in range(3):
            with pytest.raises(CardDeclined, match=r"^card declined: insufficient funds for 12$"):
                await charge(12)
    assert runs == 1


async def test_other_errors_release_and_retry_with_the_same_key(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    events: list[GuardEvent] = []
    guard = make_guard(on_event=events.append)
    keys: list[str] = []
    boom = RuntimeError("socket closed")

    @kind.once(guard)
    def charge(amount: int, idempotency_key: str = "") -> int:
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise boom
        return amount

    with task(tid()):
        with pytest.raises(RuntimeError) as info:
            await charge(3)
        assert info.value is boom  # unwrapped, the very object
        assert await charge(3) == 3
        assert await charge(3) == 3
    assert len(keys) == 2 and keys[0] == keys[1]
    assert [e.kind for e in events if e.kind in ("released", "takeover")] == ["released", "takeover"]


async def test_cancelled_call_releases_its_claim(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    keys: list[str] = []
    started = asyncio.Event()

    @guard.once
    async def charge(amount: int, idempotency_key: str = "") -> int:
        keys.append(idempotency_key)
        if len(keys) == 1:
            started.set()
            await asyncio.sleep(60)
        return amount

    with task(tid()):
        call = asyncio.create_task(charge(9))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Released, not held: the retry runs at once (no lease wait) with the same key.
        assert await asyncio.wait_for(charge(9), timeout=10) == 9
    assert len(keys) == 2 and keys[0] == keys[1]


async def test_client_timeout_still_records_the_outcome(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    @guard.once
    async def charge(amount: int) -> int:
        nonlocal runs
        runs += 1
        return amount

    with task(tid()):
        # A timeout that fires while the outcome is being recorded must not split run from record.
        for i in range(60):  # timeouts that land in the claim, the body and the recording alike
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(charge(1), timeout=0.0001 * (1 + i % 30))
        assert await charge(1) == 1
    assert runs == 1


async def test_arguments_without_canonical_form_are_refused(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    @guard.once
    async def charge(customer: Any) -> None:
        nonlocal runs
        runs += 1

    with task(tid()):
        with pytest.raises(TypeError, match="customer"):
            await charge(object())
        with pytest.raises(TypeError, match="customer"):
            await charge(float("nan"))
        with pytest.raises(TypeError, match=r"customer.*4300 digits"):  # an int too long to write down
            await charge(10**5000)
    assert runs == 0


@dataclasses.dataclass
class Point:
    x: int
    y: Decimal


async def test_canonical_fingerprints(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    @guard.once
    async def record(payload: Any) -> None:
        nonlocal runs
        runs += 1

    with task(tid()):
        await record({"b": 1, "a": [Point(1, Decimal("1.10")), uuid.UUID(int=5), dt.date(2026, 1, 2)]})
        await record({"a": [Point(1, Decimal("1.1")), uuid.UUID(int=5), dt.date(2026, 1, 2)], "b": 1.0})
    assert runs == 1  # key order, Decimal scale and 1 vs 1.0 do not change the fingerprint


RESULTS: list[Any] = [0, 0.0, {}, [], "", False, None, (), (1, "a"), Decimal("0.10"), Decimal("-1E+3"),
                      2**80, -(2**70), dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC), dt.date(2026, 1, 1),
                      uuid.UUID(int=7), b"\x00\xff", {"nested": {"d": Decimal("1.5"), "t": (1, (2,))}},
                      {1: "int key"}, {"$ag": "looks like a tag"}, {1, 2}, frozenset({"x"}), float("inf")]


@pytest.mark.parametrize("value", RESULTS, ids=lambda v: f"{type(v).__name__}:{v!r}"[:40])
async def test_results_replay_exactly_untyped(make_guard: Callable[..., Guard], value: Any) -> None:
    guard = make_guard()
    runs = 0

    @guard.once
    async def tool():  # type: ignore[no-untyped-def]  # no annotation: tagged JSON keeps the types
        nonlocal runs
        runs += 1
        return value

    with task(tid()):
        first, again = await tool(), await tool()
    assert runs == 1
    for got in (first, again):
        assert got == value and type(got) is type(value)
    if isinstance(value, dict) and "nested" in value:
        assert type(again["nested"]["d"]) is Decimal and again["nested"]["t"] == (1, (2,))


async def test_typed_results_replay_with_their_types(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    @guard.once(operation="a")
    async def money() -> Decimal:
        return Decimal("12.30")

    @guard.once(operation="b")
    async def pair() -> tuple[int, str]:
        return (0, "")

    @guard.once(operation="c")
    async def charges() -> dict[str, Charge]:
        return {"x": Charge(id="ch", amount=Decimal("1.00"), at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))}

    @guard.once(operation="d")
    async def big() -> int:
        return 2**100

    @guard.once(operation="e")
    def falsy() -> dict[str, Any]:
        return {}

    with task(tid()):
        for fn in (money, pair, charges, big):
            a, b = await fn(), await fn()
            assert a == b and type(a) is type(b)
        assert str(await money()) == "12.30"
        assert isinstance((await charges())["x"], Charge)
        assert await asyncio.to_thread(falsy) == {}
        assert await asyncio.to_thread(falsy) == {}


async def test_decoration_validates_options(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    async def charge(order_id: str, amount: int, idempotency_key: str = "") -> int:
        return amount

    with pytest.raises(TypeError, match="order"):
        guard.once(key=["order"])(charge)
    with pytest.raises(TypeError, match="memo"):
        guard.once(ignore=["memo"])(charge)
    with pytest.raises(TypeError, match="inject"):
        guard.once(inject="key_param")(charge)
    with pytest.raises(TypeError, match="cache_errors"):
        guard.once(cache_errors=("CardDeclined",))(charge)  # type: ignore[arg-type]

    def returns_lock() -> threading.Lock:  # type: ignore[valid-type]
        return threading.Lock()

    with pytest.raises(TypeError, match="cannot be stored"):
        guard.once(returns_lock)


async def test_signature_hides_the_injected_key_and_keeps_the_kind(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    async def charge(order_id: str, amount_cents: int, idempotency_key: str) -> int:
        """Charge the customer."""
        return amount_cents

    def charge_sync(idempotency_key: str, order_id: str) -> str:
        return idempotency_key

    wrapped = guard.once(key=["order_id"])(charge)
    wrapped_sync = guard.once(charge_sync)
    assert inspect.iscoroutinefunction(wrapped) and not inspect.iscoroutinefunction(wrapped_sync)
    assert list(inspect.signature(wrapped).parameters) == ["order_id", "amount_cents"]
    assert "idempotency_key" not in wrapped.__annotations__ and "idempotency_key" in charge.__annotations__
    assert wrapped.__name__ == "charge" and wrapped.__doc__ == "Charge the customer."
    assert list(inspect.signature(wrapped_sync).parameters) == ["order_id"]
    with task(tid()):
        key = await asyncio.to_thread(wrapped_sync, "o-1")  # the key reaches a leading parameter too
        assert key.startswith("ag_") and len(key) == 51
        with pytest.raises(TypeError):
            await wrapped("o-1", 1, idempotency_key="forged")  # type: ignore[call-arg]


async def test_current_key_is_the_innermost_call_and_threads_are_independent(
    make_guard: Callable[..., Guard]
) -> None:
    guard = make_guard()
    seen: dict[str, tuple[str, ...]] = {}

    @guard.once(key=["n"])
    async def inner(n: int, idempotency_key: str = "") -> str:
        assert current_key() == idempotency_key
        return idempotency_key

    @guard.once
    async def outer(idempotency_key: str = "") -> tuple[str, str, str]:
        mine = current_key()
        a = await inner(1)
        b = await inner(2)
        assert current_key() == mine == idempotency_key
        return mine, a, b

    @guard.once(key=["n"])
    def in_thread(n: int) -> str:
        return current_key()

    with pytest.raises(GuardError):
        current_key()
    with task(tid()):
        mine, a, b = await outer()
        assert len({mine, a, b}) == 3

    def worker(n: int) -> None:
        with task(f"thread-task-{n}"):
            seen[str(n)] = (in_thread(n), in_thread(n))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    keys = [v[0] for v in seen.values()]
    assert len(seen) == 8 and all(v[0] == v[1] for v in seen.values()) and len(set(keys)) == 8


async def test_twenty_coroutines_one_key_one_execution(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount: int) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.05)
        return {"id": f"ch_{runs}", "amount": Decimal(amount)}

    with task(tid()):
        results = await asyncio.gather(*(charge("o-1", 100) for _ in range(20)))
    assert runs == 1 and all(r == results[0] for r in results)


async def test_eight_threads_one_key_one_execution(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0
    lock = threading.Lock()
    barrier = threading.Barrier(8)
    t = tid()
    results: list[Any] = []

    @guard.once
    def charge(amount: int) -> dict[str, Any]:
        nonlocal runs
        with lock:
            runs += 1
        return {"run": runs, "amount": amount}

    def worker() -> None:
        with task(t):
            barrier.wait()
            results.append(charge(1))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert runs == 1 and len(results) == 8 and all(r == {"run": 1, "amount": 1} for r in results)


async def test_keys_are_stable_across_guards_and_scoped(store_url: str) -> None:
    keys: list[str] = []
    async with Guard(store_url) as g1, Guard(store_url) as g2:

        async def body(idempotency_key: str = "") -> str:
            keys.append(idempotency_key)
            return idempotency_key

        a, b = g1.once(operation="op")(body), g2.once(operation="op")(body)
        with task("same-task"):
            ka = await a()
            kb = await b()  # another Guard instance, same store: a replay with the same key
        with task("same-task", scope="acct_2"):
            kc = await b()
    assert ka == kb and kc != ka and len(keys) == 2
    assert "same-task" not in ka and "op" not in ka  # opaque: no names or personal data


async def test_retention_expiry_and_sweep(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard(retention=0.5, lease=30)
    runs = 0
    started, finish = asyncio.Event(), asyncio.Event()

    @guard.once(key=["n"])
    async def tool(n: int) -> int:
        nonlocal runs
        runs += 1
        return runs

    @guard.once
    async def long_running() -> None:
        started.set()
        await finish.wait()

    with task(tid()):
        assert await tool(0) == 1
        await asyncio.sleep(0.7)
        assert await tool(0) == 2  # past retention: treated as absent, a new operation
        for n in range(1, 6):
            await tool(n)
        running = asyncio.create_task(long_running())
        await started.wait()
        await asyncio.sleep(0.7)
        deleted = await guard.sweep(batch=2)  # bounded batches, all expired records
        assert deleted == 6
        listed = await guard.records()
        assert [r.state for r in listed] == ["running"]  # a running claim with a live lease is kept
        finish.set()
        await running
    assert runs == 7


async def test_many_tools_on_one_guard_keep_separate_records(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    counts: dict[str, int] = {}

    def make(name: str) -> Callable[[int], Any]:
        async def body(x: int) -> str:
            counts[name] = counts.get(name, 0) + 1
            return name

        return guard.once(operation=name)(body)

    tools = [make(f"tool{i}") for i in range(5)]
    with task(tid()):
        for _ in range(2):
            assert await asyncio.gather(*(t(1) for t in tools)) == [f"tool{i}" for i in range(5)]
    assert counts == {f"tool{i}": 1 for i in range(5)}


async def test_run_programmatic_entry(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    async def body(key: str) -> dict[str, str]:
        nonlocal runs
        runs += 1
        return {"key": key}

    t = tid()
    a = await guard.run("create_charge", body, arguments={"order_id": "o-1"}, key={"order_id": "o-1"}, task_id=t)
    b = await guard.run("create_charge", body, arguments={"order_id": "o-1"}, key={"order_id": "o-1"}, task_id=t)
    assert not a.replayed and b.replayed and a.value == b.value == {"key": a.key} and runs == 1
    with pytest.raises(MissingTaskError):
        await guard.run("create_charge", body, arguments={})


async def test_config_mistakes_are_precise() -> None:
    with pytest.raises(ValueError, match="lease"):
        Guard("sqlite+aiosqlite://", lease=0)
    with pytest.raises(ValueError, match="on_conflict"):
        Guard("sqlite+aiosqlite://", on_conflict="block")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unsupported store URL"):
        Guard("mysql://localhost/db")
    with pytest.raises(ValueError, match="asyncpg"):
        Guard("postgresql+psycopg2://localhost/db")
    with pytest.raises(ValueError, match="malformed"):
        Guard("::not a url::")
    with pytest.raises(ValueError, match="task id"):
        task("")


async def test_in_memory_store_for_users_tests() -> None:
    async with Guard("sqlite+aiosqlite://") as guard:
        runs = 0

        @guard.once
        async def charge(n: int) -> int:
            nonlocal runs
            runs += 1
            return n

        @guard.once
        def charge_sync(n: int) -> int:
            nonlocal runs
            runs += 1
            return n

        with task("mem"):
            assert [await charge(1), await charge(1)] == [1, 1]
            assert [await asyncio.to_thread(charge_sync, 2) for _ in range(2)] == [2, 2]
        assert runs == 2


def test_sync_only_program_with_close(store_url: str) -> None:
    """A plain script: no event loop of its own, sync tools, and close() at the end."""
    with Guard(store_url) as guard:
        runs = 0

        @guard.once(key=["to"])
        def send_email(to: str, body: str, idempotency_key: str = "") -> str:
            nonlocal runs
            runs += 1
            return idempotency_key

        with task(tid()):
            first = send_email("a@example.com", "hi")
            assert send_email("a@example.com", "hi") == first
            with pytest.raises(KeyReuseError):
                send_email("a@example.com", "changed")
    assert runs == 1 and first.startswith("ag_")
    guard.close()  # idempotent


async def test_audit_is_stored_beside_the_record_and_listed(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    async def body(key: str) -> int:
        return 1

    t = tid()
    await guard.run("create_charge", body, task_id=t, audit={"claudecode/toolUseId": "toolu_01"})
    await guard.run("create_charge", body, task_id=t, audit={"claudecode/toolUseId": "toolu_02"})
    (rec,) = await guard.records(task_id=t)
    assert rec.audit == {"claudecode/toolUseId": "toolu_01"}  # the first caller's; a replay writes nothing


_THREADS_AT_EXIT = (  # whether this interpreter lets an atexit function start a thread (3.12.0-3.12.x may not)
    "import atexit, threading\n"
    "@atexit.register\n"
    "def probe():\n"
    "    try:\n"
    "        threading.Thread(target=print, args=('threads at exit',)).start()\n"
    "    except RuntimeError:\n"
    "        print('no threads at exit')\n"
)


@pytest.mark.parametrize("exit_when", ["before-the-writers-batch", "after-the-writers-batch"])
def test_whitebox_a_guard_nobody_closes_leaks_nothing_and_writes_its_ledger_at_exit(
        store_url: str, tmp_path: Any, exit_when: str) -> None:
    """A module-level Guard used from several asyncio.run() calls (or per-test loops) and never closed: each
    loop's connections are closed when that loop shuts down, and at the process's exit the guard writes the
    ledger entries still queued and closes its own loop's connections: nothing is left open, no ResourceWarning,
    whether the process exits before the ledger's writer wrote its batch (its gathering made to last an hour) or
    after (its connection then idle). Where the interpreter refuses to start a thread at exit and the store needs
    one for its connection (SQLite, on Python 3.12), the entries are dropped and said so, never silently."""
    import subprocess
    import sys

    script = tmp_path / "loops.py"
    script.write_text(
        "import asyncio, gc, logging, sys, time\n"
        "from agentguard import Guard, task, _ledger\n"
        "logging.basicConfig(level=logging.WARNING, format='%(name)s: %(message)s')\n"
        "before = sys.argv[2] == 'before-the-writers-batch'\n"
        "if before:\n"
        "    _ledger.INTERVAL = 3600.0  # the writer gathers until the exit\n"
        "guard = Guard(sys.argv[1])\n"
        "@guard.once\n"
        "async def tool(x: int) -> int:\n"
        "    return x\n"
        "for i in range(4):\n"
        "    with task(f'loop-{i}'):\n"
        "        assert asyncio.run(tool(i)) == i\n"
        "while not before and guard._ledger.pending:  # the writer's batch written, its connection idle\n"
        "    time.sleep(0.01)\n"
        "gc.collect()\n"
        "portal = guard._portal._loop  # the guard's own background loop (its ledger writer): not the callers'\n"
        "print('engines left', sum(loop is not portal for loop in list(guard._store._engines._engines)))\n"
    )
    out = subprocess.run([sys.executable, "-X", "dev", "-W", "error", str(script), store_url, exit_when],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "engines left 0" in out.stdout
    assert "ResourceWarning" not in out.stderr and "unclosed" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr

    async def written() -> list[str]:
        async with Guard(store_url, ledger=False) as reader:
            return [a.task_id for a in await reader.attempts(limit=100)]

    tasks = asyncio.run(written())
    probe = subprocess.run([sys.executable, "-c", _THREADS_AT_EXIT], capture_output=True, text=True, timeout=60)
    if (exit_when == "before-the-writers-batch" and store_url.startswith("sqlite")
            and "no threads at exit" in probe.stdout):  # (its writer's connection was never opened)
        assert tasks == [], tasks
        assert "the store failed to take a guard's last 4 ledger entries" in out.stderr, out.stderr
        assert "can't create new thread" in out.stderr, out.stderr
    else:
        assert sorted(tasks) == [f"loop-{i}" for i in range(4)], (tasks, out.stderr)
        # Nothing dropped, nothing cut off: no line of agentguard's logger. (Other lines may come: asyncio's debug
        # mode, on by -X dev, names a slow step under load, and its task's frames are agentguard's.)
        assert not [line for line in out.stderr.splitlines() if line.startswith("agentguard")], out.stderr


async def test_whitebox_a_guard_dropped_unclosed_writes_its_ledger_and_ends_its_threads(store_url: str) -> None:
    """Guards made and dropped without being closed (one per request, say): each, once collected, writes the
    ledger entries it still queued and closes its connections in the background; its portal's thread and its
    connections' threads end, and on Postgres its sessions close, while the loop that used it runs on."""
    threads: list[threading.Thread] = []
    for i in range(6):
        g = Guard(store_url)

        @g.once
        def sync_tool(x: int) -> int:
            return x

        async def body(key: str, i: int = i) -> int:
            return i

        with task(f"dropped-{i}"):
            assert (await g.run("charge", body, arguments={"i": i})).value == i
            assert await asyncio.to_thread(sync_tool, i) == i  # (a sync tool's call, in a thread of its own)
        portal = g._portal._thread
        assert portal is not None and portal.is_alive()
        threads.append(portal)
        threads += [getattr(d, "_thread", d)  # (aiosqlite's: Connection._thread from 0.22, before it a Thread)
                    for ds in g._store._engines._opened.values() for d in ds]
        del g, sync_tool
    gc.collect()

    async def sessions() -> int:  # (Postgres: this database's other sessions than the reader's)
        async with Guard(store_url, ledger=False) as reader:
            if not store_url.startswith("postgresql"):
                return 0
            async with reader._store.engine().connect() as conn:
                return int((await conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()")).scalar_one())

    deadline = time.monotonic() + 60  # (a bound on the wait, not a measure: it ends as soon as all have ended)
    while (any(t.is_alive() for t in threads) or await sessions()) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # (threads and another server's sessions: no event to await)
    assert [t.name for t in threads if t.is_alive()] == []
    assert await sessions() == 0
    async with Guard(store_url, ledger=False) as reader:
        tasks = sorted(a.task_id for a in await reader.attempts(limit=100))
    assert tasks == sorted(f"dropped-{i}" for i in range(6) for _ in range(2))


async def test_heartbeat_keeps_a_long_call_its_claim(make_guard: Callable[..., Guard]) -> None:
    """A body that runs for several leases is renewed, never taken over while its worker is alive. (The lease is
    short for a test, and long enough that a loaded machine's stall of a second costs no renewal: renewed every
    third of it.)"""
    guard = make_guard(lease=1.5)
    other = make_guard(lease=1.5, on_conflict="raise")
    runs = 0
    events: list[str] = []

    async def body(n: int) -> int:
        nonlocal runs
        runs += 1
        await asyncio.sleep(5.0)  # more than three leases
        return n

    slow = guard.once(operation="slow")(body)
    probe = other.once(operation="slow")(body)
    with task(tid()):
        first = asyncio.create_task(slow(1))
        for _ in range(3):
            await asyncio.sleep(1.4)
            with pytest.raises(InProgressError):
                await probe(1)  # the lease is live each time: no takeover
            events.append("refused")
        assert await first == 1
        assert await probe(1) == 1  # replayed
    assert runs == 1 and events == ["refused"] * 3


async def test_a_store_object_through_the_public_seam(store_url: str) -> None:
    """``Guard(store=...)``: any ``ClaimStore`` (here a wrapper that counts the claims it is asked for);
    refused with a URL beside it, or when it is not a store at all."""
    from agentguard.stores import SQLStore

    class Counting:
        def __init__(self, inner: SQLStore) -> None:
            self.inner, self.claims = inner, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Any:
            self.claims += 1
            return await self.inner.claim(params, likely_taken)

    store = Counting(SQLStore(store_url))
    async with Guard(store=store, cache_size=0) as guard:  # type: ignore[arg-type]
        runs = 0

        @guard.once
        async def charge(amount: int) -> int:
            nonlocal runs
            runs += 1
            return amount

        with task(tid()):
            assert await charge(5) == await charge(5) == 5
    assert runs == 1 and store.claims == 2
    with pytest.raises(ValueError, match="not both"):
        Guard(store_url, store=store)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ClaimStore"):
        Guard(store=object())  # type: ignore[arg-type]


async def test_the_body_adds_to_the_audit_of_its_record(make_guard: Callable[..., Guard], kind: ToolKind) -> None:
    """``current_audit()``: entries a body adds are stored with its outcome (or its release), beside the audit
    the call was made with; outside a guarded call it is an error."""
    from agentguard import current_audit

    guard = make_guard()

    @kind.once(guard, key=["order_id"])
    def charge(order_id: str, fail: bool = False) -> str:
        current_audit()["approved_by"] = "ops@example.com"
        if fail:
            raise ConnectionError("provider down")
        return order_id

    t = tid()
    with task(t):
        assert await charge("o-1") == "o-1"
        with pytest.raises(ConnectionError):
            await charge("o-2", fail=True)
    audits = {r.operation: r.audit for r in await guard.records(task_id=t)}
    assert audits == {'charge[order_id="o-1"]': {"approved_by": "ops@example.com"},
                      'charge[order_id="o-2"]': {"approved_by": "ops@example.com"}}
    outcome = await guard.run("op", _noting, task_id=t, audit={"host": "ci"})
    assert outcome.value == "noted"
    assert [r.audit for r in await guard.records(task_id=t) if r.operation == "op"] == [{"host": "ci", "note": 1}]
    with pytest.raises(GuardError, match="outside a guarded call"):
        current_audit()


async def _noting(key: str) -> str:
    from agentguard import current_audit

    current_audit()["note"] = 1
    return "noted"
