"""One id rule for task ids, scopes and operation names, the same on both backends: what one store accepts the
other accepts, and what neither can hold is refused before anything runs, with a precise error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentguard import Guard, MissingTaskError, task

from bad_ids import BAD_TASK_IDS, MAX_OPERATION, MAX_SCOPE, MAX_TASK_ID

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("value", "why"), BAD_TASK_IDS)
def test_task_refuses_what_a_store_cannot_hold(value: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        task(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "scope", ["", " ", "s\x00", "s\udfff", "s" * (MAX_SCOPE + 1), 7],
)
def test_bad_scopes_are_refused(scope: object) -> None:
    with pytest.raises(ValueError, match="scope"):
        task("t-1", scope=scope)  # type: ignore[arg-type]


async def test_operation_names_are_checked_at_decoration(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    def charge(order_id: str) -> str:
        return order_id

    with pytest.raises(TypeError, match="operation must be a string"):
        guard.once(operation=123)(charge)  # type: ignore[call-overload]
    for bad in ("", "op\x00", "op\ud800", "o" * (MAX_OPERATION + 1)):
        with pytest.raises(ValueError, match="operation"):
            guard.once(operation=bad)(charge)


async def test_run_refuses_bad_ids_before_the_body(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    ran: list[str] = []

    async def body(key: str) -> str:
        ran.append(key)
        return "charged"

    for value, why in BAD_TASK_IDS:
        if value is None:
            why = "no task id"  # task_id=None means "from the task(...) context", and there is none
        with pytest.raises(MissingTaskError, match=why):
            await guard.run("charge", body, task_id=value)  # type: ignore[arg-type]
    for scope in ("", "s\x00", "s" * (MAX_SCOPE + 1)):
        with pytest.raises(ValueError, match="scope"):
            await guard.run("charge", body, task_id="t-1", scope=scope)
    with pytest.raises(TypeError, match="operation must be a string"):
        await guard.run(123, body, task_id="t-1")  # type: ignore[arg-type]
    assert ran == []


@pytest.mark.parametrize(
    ("task_id", "scope"),
    [
        ("t" * MAX_TASK_ID, "s" * MAX_SCOPE),  # the limits themselves
        ("ü" * MAX_TASK_ID, "é" * MAX_SCOPE),  # characters, not bytes
        ("票-\U0001f4b3-tab\tand newline\n", "租户 \U0001f3e6"),
    ],
)
async def test_the_longest_and_widest_ids_work_on_this_backend(
    make_guard: Callable[..., Guard], task_id: str, scope: str
) -> None:
    """Run on SQLite and on Postgres by the suite: ids at the limits are stored, replayed and listed."""
    guard = make_guard()
    runs: list[int] = []

    @guard.once(key="order_id", operation="o" * MAX_OPERATION)
    async def charge(order_id: str, amount: int) -> dict[str, Any]:
        runs.append(amount)
        return {"order": order_id, "amount": amount}

    async with task(task_id, scope=scope):
        first = await charge("o-\u00e9\U0001f4b3", 100)
        again = await charge("o-\u00e9\U0001f4b3", 100)
    assert first == again == {"order": "o-\u00e9\U0001f4b3", "amount": 100}
    assert runs == [100]
    listed = await guard.records(scope=scope, task_id=task_id)
    assert [(r.task_id, r.scope, r.state) for r in listed] == [(task_id, scope, "succeeded")]


async def test_a_key_callable_follows_the_rule_too(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs: list[str] = []

    @guard.once(key=lambda a: a["ref"])
    async def refund(ref: str) -> str:
        runs.append(ref)
        return ref

    async with task("t-1"):
        for bad in ("r\x00", "r\ud800", "  "):
            with pytest.raises(ValueError, match="the key of 'refund'"):
                await refund(bad)
        assert await refund("r-1") == "r-1"
    assert runs == ["r-1"]
