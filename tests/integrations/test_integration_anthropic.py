"""The Anthropic SDK's tool runner: its real loop (``client.beta.messages.tool_runner``), sync and async,
against a fake of the Messages API on loopback (``tests/fake_anthropic.py``), offline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anthropic
import pytest
from anthropic import beta_async_tool, beta_tool

from agentguard import Guard, task
from agentguard.integrations.anthropic import once

from fake_anthropic import FakeMessagesAPI, result_text, tool_results

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
class Ledger:
    def __init__(self) -> None:
        self.charges: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()

    def charge(self, order_id: str, amount_cents: int, key: str) -> str:
        with self.lock:
            self.charges.append((order_id, amount_cents, key))
            return f"charged {order_id}: {amount_cents} cents, ch_{len(self.charges)}"


def script(*turns: Sequence[int]) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """The model's replies: one per turn, each the charge calls it makes for order o-1 (by amount), then text."""

    def reply(body: dict[str, Any]) -> list[dict[str, Any]]:
        n = sum(m["role"] == "assistant" for m in body["messages"])
        if n < len(turns):
            return [
                {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": "charge",
                 "input": {"order_id": "o-1", "amount_cents": a}}
                for i, a in enumerate(turns[n])
            ]
        return [{"type": "text", "text": "done"}]

    return reply


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI(request.param) as fake:
        yield fake


def sync_charge(guard: Guard, ledger: Ledger) -> Any:
    @beta_tool
    @once(guard, key="order_id")
    def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
        """Charge an order.

        Args:
            order_id: the order to charge
            amount_cents: how much
        """
        return ledger.charge(order_id, amount_cents, idempotency_key)

    return charge


async def run_sync(api: FakeMessagesAPI, tool: Any) -> str:
    """The sync runner, on a worker thread (with the caller's context), as a sync agent loop would run."""
    return await asyncio.to_thread(_run_sync, api, tool)


def _run_sync(api: FakeMessagesAPI, tool: Any) -> str:
    client = anthropic.Anthropic(api_key="test", base_url=api.url, max_retries=0)
    runner = client.beta.messages.tool_runner(
        model="claude-test", max_tokens=100, tools=[tool], messages=[{"role": "user", "content": "charge o-1"}]
    )
    final = runner.until_done()
    client.close()
    return "".join(b.text for b in final.content if b.type == "text")


@pytest.mark.parametrize("api", [script([500], [500], [500, 500])], indirect=True)
async def test_retry_after_a_timeout_and_parallel_duplicates_charge_once(guard: Guard, api: FakeMessagesAPI) -> None:
    ledger = Ledger()
    with task("ticket-1"):
        assert await run_sync(api, sync_charge(guard, ledger)) == "done"
    assert len(ledger.charges) == 1
    results = tool_results(api.requests[-1])
    assert result_text(results["toolu_0_0"]) == "charged o-1: 500 cents, ch_1"
    texts = {result_text(results[i]) for i in ("toolu_1_0", "toolu_2_0", "toolu_2_1")}  # replays: told so
    assert texts == {f"{NOTE.format(task='ticket-1')}\n\ncharged o-1: 500 cents, ch_1"}
    assert not any(r.get("is_error") for r in results.values())
    (record,) = await guard.records()
    assert record.task_id == "ticket-1" and ledger.charges[0][2] == record.key


NOTE = ("agentguard: REPLAY. charge[order_id=\"o-1\"] already happened in task {task!r}; this is its recorded "
        "result, returned again. Nothing was executed again.")


@pytest.mark.parametrize("api", [script([500], [500], [500])], indirect=True)
async def test_a_replay_of_content_blocks_gets_a_first_text_block_and_replay_note_false_none(
    guard: Guard, api: FakeMessagesAPI
) -> None:
    """A tool returning content blocks: each replay the model reads is the first call's blocks, unchanged, after
    one more holding the note; the same tool guarded with replay_note=False replays the blocks alone."""
    ledger = Ledger()

    def blocks(quiet: bool) -> Any:
        @beta_async_tool
        @once(guard, key="order_id", replay_note=not quiet)
        async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> list[dict[str, Any]]:
            """Charge an order."""
            return [{"type": "text", "text": ledger.charge(order_id, amount_cents, idempotency_key)}]

        return charge

    client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
    with task("ticket-b"):
        runner = client.beta.messages.tool_runner(
            model="claude-test", max_tokens=100, tools=[blocks(False)], messages=[{"role": "user", "content": "go"}]
        )
        await runner.until_done()
        assert await blocks(True).call({"order_id": "o-1", "amount_cents": 500}) == [
            {"type": "text", "text": "charged o-1: 500 cents, ch_1"}]
    await client.close()
    assert len(ledger.charges) == 1
    results = tool_results(api.requests[-1])
    first = [{"type": "text", "text": "charged o-1: 500 cents, ch_1"}]
    assert results["toolu_0_0"]["content"] == first
    assert results["toolu_1_0"]["content"] == results["toolu_2_0"]["content"] == [
        {"type": "text", "text": NOTE.format(task="ticket-b")}, *first]


@pytest.mark.parametrize("api", [script([500], [700])], indirect=True)
async def test_other_arguments_reach_the_model_as_an_is_error_result(guard: Guard, api: FakeMessagesAPI) -> None:
    ledger = Ledger()

    @beta_async_tool
    @once(guard, key="order_id")
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
        """Charge an order."""
        return ledger.charge(order_id, amount_cents, idempotency_key)

    client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
    with task("ticket-2"):
        runner = client.beta.messages.tool_runner(
            model="claude-test", max_tokens=100, tools=[charge], messages=[{"role": "user", "content": "go"}]
        )
        await runner.until_done()
    await client.close()
    assert len(ledger.charges) == 1
    refused = tool_results(api.requests[-1])["toolu_1_0"]
    assert refused["is_error"] is True
    text = result_text(refused)
    assert text.startswith("Refused by agentguard: ")  # the refusal alone, not an exception's repr
    assert "already called in task 'ticket-2' with different arguments" in text and "amount_cents" in text
    assert text.endswith("Nothing was executed.")


@pytest.mark.parametrize("api", [script([500])], indirect=True)
async def test_without_a_task_the_model_is_told_nothing_ran(guard: Guard, api: FakeMessagesAPI) -> None:
    ledger = Ledger()
    await run_sync(api, sync_charge(guard, ledger))
    assert ledger.charges == []
    refused = tool_results(api.requests[-1])["toolu_0_0"]
    assert refused["is_error"] is True and "no task id" in result_text(refused)


@pytest.mark.parametrize("api", [script([500])], indirect=True)
async def test_the_model_sees_no_injected_key(guard: Guard, api: FakeMessagesAPI) -> None:
    with task("t"):
        await run_sync(api, sync_charge(guard, Ledger()))
    (declared,) = api.requests[0]["tools"]
    assert declared["name"] == "charge"
    schema = declared["input_schema"]
    assert set(schema["properties"]) == {"order_id", "amount_cents"} == set(schema["required"])
    assert schema["properties"]["order_id"].get("description") == "the order to charge"


async def test_once_on_top_of_beta_tool_says_which_way_round(guard: Guard) -> None:
    def charge(order_id: str) -> str:
        return order_id

    with pytest.raises(TypeError, match=r"placed on top of a BetaFunctionTool made by the Anthropic SDK's @beta_tool"):
        once(guard, key="order_id")(beta_tool(charge))


@pytest.mark.storeless
async def test_a_misspelt_key_is_refused_at_decoration(guard: Guard) -> None:
    ledger = Ledger()
    with pytest.raises(TypeError) as info:

        @beta_async_tool
        @once(guard, key="orderid")
        async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
            """Charge an order."""
            return ledger.charge(order_id, amount_cents, idempotency_key)

    assert str(info.value) == ("key='orderid' is not an argument of charge (did you mean 'order_id'?); its arguments "
                               "are: amount_cents, order_id")
    assert ledger.charges == []
