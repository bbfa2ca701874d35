"""Forwarding the downstream key: the httpx hook and the official stripe client, against a local provider that
deduplicates like Stripe."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import stripe

from agentguard import Guard, GuardError, current_key, downstream, sub_key, task
from tests.fake_provider import FakeProvider

pytestmark = pytest.mark.anyio


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


def echo_client(seen: list[httpx.Request]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    return httpx.Client(base_url="https://provider.test", transport=httpx.MockTransport(handler),
                        event_hooks={"request": [downstream.idempotency_hook]})


async def test_hook_adds_the_key_only_inside_a_guarded_call(guard: Guard) -> None:
    seen: list[httpx.Request] = []
    client = echo_client(seen)

    @guard.once(key="order_id")
    def charge(order_id: str) -> str:
        client.post("/v1/charges", json={"order_id": order_id})
        client.get("/v1/charges")  # a safe method: never stamped
        client.post("/v1/charges", json={}, headers={"Idempotency-Key": "mine"})  # the caller's key wins
        return current_key()

    client.post("/v1/charges", json={})  # outside a guarded call
    with task("t-1"):
        key = charge("o-1")
    assert [r.headers.get("Idempotency-Key") for r in seen] == [None, key, None, "mine"]
    assert key.startswith("ag_") and len(key) <= 255


async def test_sub_keys_by_name_are_distinct_and_stable(guard: Guard) -> None:
    seen: list[httpx.Request] = []
    client = echo_client(seen)
    attempts = [RuntimeError("crashed after both calls")]

    @guard.once(key="order_id")
    def charge(order_id: str) -> str:
        client.post("/v1/charges", json={"order_id": order_id}, extensions=downstream.named("charge"))
        client.post("/v1/fees", json={"order_id": order_id}, extensions=downstream.named("fee"))
        if attempts:
            raise attempts.pop()
        return current_key()

    with task("t-1"):
        with pytest.raises(RuntimeError):
            charge("o-1")
        key = charge("o-1")
    keys = [r.headers["Idempotency-Key"] for r in seen]
    assert keys == [sub_key(key, "charge"), sub_key(key, "fee")] * 2
    assert len(set(keys)) == 2 and key not in keys
    assert downstream.named("fee") == {downstream.NAME_EXTENSION: "fee"}
    with pytest.raises(ValueError, match="non-empty"):
        downstream.named("")


async def test_async_hook_and_install(guard: Guard, provider: FakeProvider) -> None:
    async with httpx.AsyncClient(base_url=provider.url) as client:
        downstream.install(client)
        downstream.install(client)  # once only
        assert client.event_hooks["request"] == [downstream.async_idempotency_hook]

        @guard.once(key="order_id")
        async def charge(order_id: str, amount: int) -> dict[str, Any]:
            r = await client.post("/v1/charges", json={"order_id": order_id, "amount": amount})
            return dict(r.json())

        async with task("t-2"):
            first = await charge("o-1", 500)
            again = await charge("o-1", 500)
    assert first == again and len(provider.charges) == 1
    assert provider.keys() == [(await guard.records())[0].key]


@pytest.fixture
def client(provider: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=provider.url) as client:
        downstream.install(client)
        yield client


async def test_crash_after_the_provider_charged_retry_sends_the_same_key(
    guard: Guard, provider: FakeProvider, client: httpx.Client
) -> None:
    crashes = [ConnectionError("response lost after the charge")]
    runs = 0

    @guard.once(key="order_id")
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        r = client.post("/v1/charges", json={"order_id": order_id, "amount": amount})
        if crashes:
            raise crashes.pop()
        return dict(r.json())

    with task("t-3"):
        with pytest.raises(ConnectionError):
            charge("o-1", 500)
        receipt = charge("o-1", 500)  # the claim was released: the body runs again, with the same key
        assert charge("o-1", 500) == receipt  # and then it is replayed by the guard
    assert runs == 2
    assert len(provider.charges) == 1 and receipt["id"] == provider.charges[0]["id"]
    keys = provider.keys("/v1/charges")
    assert len(keys) == 2 and len(set(keys)) == 1
    assert [r.replayed for r in provider.requests] == [False, True]


def stripe_client(provider: FakeProvider) -> stripe.StripeClient:
    return stripe.StripeClient("sk_test_fake", base_addresses={"api": provider.url}, max_network_retries=0)


async def test_official_stripe_client_gets_the_key_and_deduplicates_a_retry(
    guard: Guard, provider: FakeProvider
) -> None:
    client = stripe_client(provider)
    crashes = [TimeoutError("read timed out after Stripe charged")]

    @guard.once(key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        intent = client.v1.payment_intents.create(
            params={"amount": amount_cents, "currency": "usd", "metadata": {"order_id": order_id}},
            options=downstream.stripe_options(),
        )
        if crashes:
            raise crashes.pop()
        return {"payment_intent": intent.id, "status": intent.status}

    with task("ticket-8812"):
        with pytest.raises(TimeoutError):
            charge("o-1", 4900)
        receipt = charge("o-1", 4900)
        assert charge("o-1", 4900) == receipt
    assert len(provider.charges) == 1 and receipt == {"payment_intent": "pi_000001", "status": "succeeded"}
    (record,) = await guard.records()
    assert provider.keys("/v1/payment_intents") == [record.key, record.key]
    assert provider.requests[1].replayed


async def test_stripe_rejects_a_reused_key_with_other_params(guard: Guard, provider: FakeProvider) -> None:
    # Why several foreign calls in one operation need sub-keys: one key, two bodies, and Stripe refuses.
    client = stripe_client(provider)

    @guard.once(key="order_id")
    def charge_and_fee(order_id: str, use_sub_keys: bool) -> list[str]:
        ids = []
        for name, amount in (("charge", 4900), ("fee", 100)):
            options = downstream.stripe_options(name if use_sub_keys else None)
            intent = client.v1.payment_intents.create(params={"amount": amount, "currency": "usd"}, options=options)
            ids.append(intent.id)
        return ids

    with task("t-a"), pytest.raises(stripe.IdempotencyError):
        charge_and_fee("o-1", False)
    with task("t-b"):
        assert charge_and_fee("o-2", True) == ["pi_000002", "pi_000003"]


async def test_stripe_options_outside_a_guarded_call_refuses() -> None:
    with pytest.raises(GuardError, match="outside a guarded call"):
        downstream.stripe_options()
    with pytest.raises(GuardError):
        downstream.key("fee")


def test_importing_agentguard_and_its_adapters_imports_no_framework(python: str) -> None:
    code = (
        "import sys, agentguard, agentguard.downstream, agentguard.integrations\n"
        "import agentguard.integrations.pydantic_ai, agentguard.integrations.openai_agents\n"
        "import agentguard.integrations.langchain, agentguard.integrations.dbos, agentguard.integrations.temporal\n"
        "heavy = {'pydantic_ai', 'agents', 'langchain', 'langchain_core', 'langgraph', 'dbos', 'temporalio',\n"
        "         'httpx', 'stripe', 'mcp'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
