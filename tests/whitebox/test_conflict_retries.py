"""The store's retry policy for a statement refused by a serialization failure (``_executor.CONFLICT_RETRIES``),
taken away: the interleaving of ``conflicts.py`` then refuses the call before its body, which shows that it
reaches the failure the public test (``tests/stores/test_pg_defaults.py``) sees replayed."""

from __future__ import annotations

import pytest

from agentguard import StoreError
from agentguard.stores import _executor

from conflicts import claim_after_a_serialization_failure

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def test_without_retries_a_claims_serialization_failure_refuses_the_call_before_its_body(
    store_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An async tool's claim, on the loop's lane: no retry, so the failure is the call's, and nothing ran. (A sync
    tool's claim in its thread would fall back to the store's verb once, which then finds the record.)"""
    monkeypatch.setattr(_executor, "CONFLICT_RETRIES", 0)
    with pytest.raises(StoreError, match=r"could not serialize access.*the tool was not run"):
        await claim_after_a_serialization_failure(store_url, "async")
