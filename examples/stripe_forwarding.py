"""Forwarding the key: the official `stripe` client and httpx, against a local fake provider that deduplicates
like Stripe. The tool crashes after the provider charged; the retry sends the same key; one charge.

Needs the stripe and httpx extras:  pip install 'agentguard-idempotency[stripe,httpx]' — and a clone of the repository
(the provider is the tests' local fake, tests/fake_provider.py)
Offline:  python examples/stripe_forwarding.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import stripe

from agentguard import Guard, downstream, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
# the tests' local provider: no network, no API key
from fake_provider import FakeProvider

guard = Guard("sqlite+aiosqlite://")


def main() -> None:
    with FakeProvider() as provider:
        # In production: stripe.StripeClient(os.environ["STRIPE_API_KEY"], http_client=..., max_network_retries=2).
        # Inside a guarded call, stripe_http_client() puts the guard's key on every request (its retries too),
        # in place of the random key stripe-python makes up; outside one it changes nothing.
        client = stripe.StripeClient("sk_test_fake", base_addresses={"api": provider.url},
                                     http_client=downstream.stripe_http_client(), max_network_retries=2)
        crashes = [TimeoutError("read timed out after Stripe charged")]

        @guard.once(key="order_id")
        def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
            intent = client.v1.payment_intents.create(  # Idempotency-Key: <the guard's downstream key>
                params={"amount": amount_cents, "currency": "usd", "metadata": {"order_id": order_id}},
            )
            if crashes:
                raise crashes.pop()
            return {"payment_intent": intent.id, "status": intent.status}

        http = httpx.Client(base_url=provider.url)
        downstream.install(http)  # Idempotency-Key on every unsafe request made inside a guarded call

        @guard.once(key="order_id")
        def fee(order_id: str) -> dict[str, Any]:
            a = http.post("/v1/charges", json={"order_id": order_id, "amount": 30}, extensions=downstream.named("fee"))
            b = http.post("/v1/charges", json={"order_id": order_id, "amount": 5}, extensions=downstream.named("tax"))
            return {"fee": a.json()["id"], "tax": b.json()["id"]}

        with task("ticket-8812"):
            try:
                charge("o-1", 4900)
            except TimeoutError as exc:
                print(f"first attempt: {exc}")
            print("retry:", charge("o-1", 4900))
            print("again:", charge("o-1", 4900), "(replayed by the guard)")
            print("fees:", fee("o-1"))
        http.close()
        for seen in provider.requests:
            print(f"  provider {seen.method} {seen.path} key={seen.idempotency_key} replayed={seen.replayed}")
        intents = [c for c in provider.charges if c["object"] == "payment_intent"]
        print(f"payment intents created: {len(intents)}")
        assert len(intents) == 1
    guard.close()


if __name__ == "__main__":
    main()
