"""A renewal of the lease still in flight when the body ends is waited for before the outcome is written: the
write never races it. (A renewal that came second would find the claim completed and report the lease lost; one
that came first and was not awaited would leave the write racing the heartbeat's statement.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentguard import Guard, GuardEvent, task
from agentguard.stores import RUNNING, SUCCEEDED, SQLStore

from conftest import tid

pytestmark = pytest.mark.anyio

LEASE = 3.0  # the heartbeat ticks every lease/6 and renews a claim a third of a lease old (long: no expiry meanwhile)


class SlowRenewal:
    """The real store, each renewal held open a while after it began (the body ends meanwhile); what each found."""

    def __init__(self, url: str) -> None:
        self.inner = SQLStore(url)
        self.renewing, self.ended = threading.Event(), threading.Event()
        self.found: list[tuple[bool, str]] = []  # (renewed, the record's state once the renewal ended)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def renew(self, scope: str, key: str, fence: int, lease: float) -> bool:
        self.renewing.set()
        try:
            await asyncio.sleep(0.3)
            renewed: bool = await self.inner.renew(scope, key, fence, lease)
            rec = await self.inner.read(scope, key)
            assert rec is not None
            self.found.append((renewed, rec.state))
            return renewed
        finally:
            self.ended.set()


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_the_outcome_is_written_after_the_renewal_in_flight_ends(store_url: str, kind: str) -> None:
    store = SlowRenewal(store_url)
    events: list[GuardEvent] = []
    async with Guard(store=store, lease=LEASE, on_event=events.append) as guard:  # type: ignore[arg-type]
        if kind == "async":

            @guard.once
            async def charge(amount: int) -> dict[str, int]:
                await asyncio.to_thread(store.renewing.wait, 30)  # returns while the renewal is in flight
                return {"amount": amount}

            with task(tid()):
                got = await charge(5)
        else:

            @guard.once
            def charge_sync(amount: int) -> dict[str, int]:
                store.renewing.wait(30)
                return {"amount": amount}

            def call() -> dict[str, int]:
                with task(tid()):
                    return charge_sync(5)

            got = await asyncio.to_thread(call)
        assert store.renewing.is_set(), "no renewal began while the body ran"
        assert await asyncio.to_thread(store.ended.wait, 30)  # (had the write not waited, the renewal ends after it)
        done = [e for e in events if e.kind == "completed"]
        assert len(done) == 1
        rec = await store.inner.read(done[0].scope, done[0].key)
    assert got == {"amount": 5}
    assert store.found and all(found == (True, RUNNING) for found in store.found), store.found
    assert [e.kind for e in events if e.kind == "lease_lost"] == []
    assert rec is not None and rec.state == SUCCEEDED
