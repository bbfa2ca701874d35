"""``op: Operation = INJECTED``: the default that lets type checkers accept calls without the injected
Operation (tests/typing_check.py and tests/project/test_readme_types.py check that side) behaves at run time: the
guard passes the real Operation, hides the parameter, and the marker itself only speaks up when the function
is called without the guard. On the suite's backend."""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Callable

import pytest

from agentguard import INJECTED, Guard, Operation, task

from conftest import tid

pytestmark = pytest.mark.anyio


async def test_a_tool_with_the_injected_default_gets_the_real_operation(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    reserved: list[str] = []
    seen: list[object] = []

    async def reserve(ride_id: str) -> str:
        reserved.append(ride_id)
        return f"seat-{ride_id}"

    @guard.once(key=["ride_id"])
    async def book(ride_id: str, op: Operation = INJECTED) -> str:
        seen.append(op)
        return await op.step("reserve", reserve, ride_id)

    assert list(inspect.signature(book).parameters) == ["ride_id"]  # hidden, default and all
    with task(tid()):
        first = await book("r-1")
        again = await book("r-1")
        with pytest.raises(TypeError):
            await book("r-1", op=INJECTED)  # type: ignore[call-arg]  # not the caller's to give
    assert first == again == "seat-r-1" and reserved == ["r-1"]  # one step run; the replay ran nothing
    assert len(seen) == 1 and isinstance(seen[0], Operation) and seen[0] is not INJECTED


async def test_called_without_the_guard_the_marker_says_so(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    @guard.once
    async def book(ride_id: str, op: Operation = INJECTED) -> str:
        return op.key("reserve")

    with pytest.raises(AttributeError, match=r"agentguard.INJECTED has no 'key': it is the default of an "
                                             r"Operation parameter, which a guarded call fills in"):
        await book.__wrapped__("r-1")  # type: ignore[attr-defined]


@pytest.mark.storeless
def test_the_marker_is_one_object_that_tools_can_copy_and_inspect() -> None:
    assert repr(INJECTED) == "agentguard.INJECTED"
    assert copy.copy(INJECTED) is INJECTED and copy.deepcopy(INJECTED) is INJECTED
    assert pickle.loads(pickle.dumps(INJECTED)) is INJECTED
    assert not hasattr(INJECTED, "__len__") and not hasattr(INJECTED, "step")  # probing finds nothing, quietly

    def fn(op: Operation = INJECTED) -> None: ...

    assert str(inspect.signature(fn)) == "(op: 'Operation' = agentguard.INJECTED) -> 'None'"
