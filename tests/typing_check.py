"""Typing-only: mypy --strict checks that the public API keeps signatures (not collected by pytest)."""

from __future__ import annotations

from decimal import Decimal

import httpx
import httpx2
import stripe

from agentguard import INJECTED, Guard, Operation, Outcome, current_key, downstream, task

guard = Guard("sqlite+aiosqlite://")


@guard.once(key=["order_id"])
async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> Decimal:
    return Decimal(amount_cents) / 100


@guard.once
def send(to: str) -> bool:
    return bool(current_key())


@guard.once(key="order_id", key_shape="square")
def pay(order_id: str, idempotency_key: str = "") -> str:
    return current_key(45) + downstream.key("fee", shape=downstream.KeyShape(32, prefix="")) + idempotency_key


@guard.once(key=["ride_id"])
async def book(ride_id: str, op: Operation = INJECTED) -> str:  # the injected Operation: callers omit it
    return await op.step("reserve", reserve, ride_id)


async def reserve(ride_id: str) -> str:
    return ride_id


async def body(key: str) -> dict[str, str]:
    return {"key": key}


async def use() -> None:
    with task("t"):
        amount: Decimal = await charge("o-1", 4900)
        sent: bool = send("a@example.com")
        booked: str = await book("r-1")
        print(booked)
        out: Outcome[dict[str, str]] = await guard.run("op", body, task_id="t")
        print(amount, sent, out.value["key"], out.replayed)


def forwarding(modern: httpx2.AsyncClient, legacy: httpx.Client) -> None:
    downstream.install(modern)
    downstream.install(legacy)
    downstream.stamp(httpx2.Request("POST", "https://provider.test", extensions=downstream.named("fee")))
    downstream.stamp(httpx.Request("POST", "https://provider.test"))
    downstream.install(legacy, shape="square")
    downstream.stamp(httpx.Request("POST", "https://provider.test"), shape=40)
    shaped: str = downstream.shape_key("ag_" + "0" * 48, downstream.SQUARE)
    client = stripe.StripeClient("sk_test", http_client=downstream.stripe_http_client(), max_network_retries=2)
    print(shaped, client)
