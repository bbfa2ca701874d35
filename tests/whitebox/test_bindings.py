"""Issue 29, item 4: a record binds its arguments only if its body ran. A call refused before its body started
(a confirmation declined, an upstream not reached, a claim undone) binds nothing: the corrected call runs with
its own arguments. A body that ran keeps binding them (Stripe's rule), and every refusal says what really became
of the earlier call."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest

from agentguard import Guard, KeyReuseError, task
from agentguard._errors import NotStarted
from agentguard._refusals import refusal

from conftest import ToolKind, tid

pytestmark = pytest.mark.anyio


class CardDeclined(Exception):
    pass


class Declined(NotStarted):
    """What the MCP proxy raises when the user says no before anything is sent."""


async def test_a_call_whose_body_never_started_binds_nothing(make_guard: Callable[..., Guard], kind: ToolKind) -> None:
    guard = make_guard()
    charged: list[int] = []

    @kind.once(guard, operation="charge")
    def charge(amount: int) -> int:
        if amount == 100:
            raise Declined("the user said no; nothing was sent")
        charged.append(amount)
        return amount

    with task(tid()):
        with pytest.raises(Declined):
            await charge(100)
        assert await charge(50) == 50  # "no, charge 50 instead": runs with its own arguments
        with pytest.raises(KeyReuseError, match="ran and succeeded, and its result stands"):
            await charge(100)  # and now the charge of 50 binds
    assert charged == [50]


@pytest.mark.parametrize("earlier", ["succeeded", "cached error", "raised"])
async def test_a_body_that_ran_keeps_binding_and_the_refusal_says_what_became_of_it(
    make_guard: Callable[..., Guard], kind: ToolKind, earlier: str
) -> None:
    guard = make_guard()
    runs: list[int] = []

    @kind.once(guard, operation="charge", cache_errors=(CardDeclined,))
    def charge(amount: int) -> int:
        runs.append(amount)
        if earlier == "cached error":
            raise CardDeclined("insufficient funds")
        if earlier == "raised" and len(runs) == 1:
            raise TimeoutError("the provider did not answer")
        return amount

    said = {
        "succeeded": "the earlier call ran and succeeded, and its result stands",
        "cached error": "the earlier call ran and failed with CardDeclined, which is recorded as its outcome",
        "raised": ("an earlier attempt ran and failed with TimeoutError; nothing was recorded, so repeating it "
                   "with exactly its arguments runs it again"),
    }[earlier]
    with task(tid()):
        with contextlib.suppress(CardDeclined, TimeoutError):
            await charge(100)
        with pytest.raises(KeyReuseError) as info:
            await charge(50)
        assert said in str(info.value) and info.value.earlier == said and info.value.differing == ("amount",)
        text = refusal(info.value)
        assert said in text and "The earlier call stands" not in text and text.endswith("Nothing was executed.")
        if earlier == "raised":
            assert await charge(100) == 100  # exactly its arguments: it runs again (released, same key)
    assert runs == ([100, 100] if earlier == "raised" else [100])


@pytest.mark.storeless
async def test_refusal_texts_name_what_the_earlier_call_did() -> None:
    """A KeyReuseError made elsewhere (no ``earlier``) still reads as a whole sentence."""
    exc = KeyReuseError("x", differing=["amount"], operation="charge", task_id="t-1")
    assert "(differing: amount): the earlier call stands. This call was not run." in refusal(exc)
