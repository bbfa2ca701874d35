"""The chaos run's own checks (``chaos/``): its provider honours keys, and its verdict catches every broken
outcome it promises to catch. The run itself (``python -m chaos --short``) is part of ``scripts/test.sh``."""

from __future__ import annotations

import asyncio
import json

import pytest

from chaos._judge import judge
from chaos._provider import Provider, ProviderError, charge

pytestmark = pytest.mark.storeless  # independent of the store's backend

OPS = [("t-0", "charge", "o0", 100), ("t-1", "book", "o1", 101)]
STORED = {"t-0": {"order": "o0", "charge": "ch_1"}, "t-1": {"order": "o1", "charge": "ch_2"}}


def _stats(charges: dict[str, list[str]] | None = None, keys: dict[str, list[str]] | None = None) -> dict[str, object]:
    return {"charges": charges or {"o0": ["ch_1"], "o1": ["ch_2"]}, "keys": keys or {"o0": ["k0"], "o1": ["k1"]},
            "requests": 2, "replayed": 0}


def _lines(*entries: dict[str, object]) -> str:
    return "\n".join(json.dumps(e) for e in entries)


GOOD = _lines({"event": "takeover", "task": "t-0"}, {"op": "t-0", "result": STORED["t-0"]},
              {"op": "t-1", "error": "InProgressError", "body_ran": False}, {"op": "t-1", "result": STORED["t-1"]})


def test_a_clean_run_passes() -> None:
    v = judge(OPS, _stats(), STORED, [], [(0, GOOD), (1, GOOD + '\n{"op": "t-1", "res')])  # a line cut by a kill
    assert v.problems == [] and v.calls == 6 and v.charges == 2 and v.events["takeover"] == 2


@pytest.mark.parametrize(("broken", "said"), [
    ({"stats": _stats(charges={"o0": ["ch_1", "ch_3"], "o1": ["ch_2"]})}, "o0: 2 charges"),
    ({"stats": _stats(charges={"o1": ["ch_2"]})}, "o0: 0 charges"),
    ({"stats": _stats(keys={"o0": ["k0", "k9"], "o1": ["k1"]})}, "o0: charged under 2 keys"),
    ({"stored": {"t-0": STORED["t-0"]}}, "t-1: no stored result"),
    ({"held": ["t-1: left running (lease left: -3.0)"]}, "left running"),
    ({"results": _lines({"op": "t-0", "result": {"order": "o0", "charge": "ch_3"}},
                        {"op": "t-1", "result": STORED["t-1"]})}, "worker 0 got"),
    ({"results": _lines({"op": "t-0", "error": "KeyReuseError", "unexpected": "..."})}, "KeyReuseError for t-0"),
    ({"results": _lines({"op": "t-0", "result": STORED["t-0"]})}, "no answer for 1 operations"),
])
def test_a_broken_run_is_caught(broken: dict[str, object], said: str) -> None:
    stats = broken.get("stats", _stats())
    stored = broken.get("stored", STORED)
    held = broken.get("held", [])
    results = broken.get("results", GOOD)
    v = judge(OPS, stats, stored, held, [(0, results)])  # type: ignore[arg-type]
    assert any(said in p for p in v.problems), v.problems


def test_the_provider_honours_keys() -> None:
    provider = Provider().start()
    try:
        async def go() -> None:
            first = await charge(provider.url, "k", "o0", 100)
            again = await charge(provider.url, "k", "o0", 100)
            assert again == {**first, "replayed": True} and first["replayed"] is False
            with pytest.raises(ProviderError, match="400"):
                await charge(provider.url, "k", "o0", 999)  # the key with other parameters
            await charge(provider.url, "k2", "o0", 100)  # another key: another charge (what a guard prevents)

        asyncio.run(go())
        stats = provider.stats()
        assert stats["charges"] == {"o0": ["ch_1", "ch_2"]} and stats["keys"] == {"o0": ["k", "k2"]}
        assert stats["requests"] == 4 and stats["replayed"] == 1
    finally:
        provider.stop()


def test_a_failed_rollback_does_not_hide_why_the_schema_failed() -> None:
    """Found by the chaos run: a worker starting while its connection was terminated (a Postgres restart,
    pg_terminate_backend) failed with "Can't reconnect until invalid transaction is rolled back" — the
    rollback's own failure, which hid the cause and so said the outage was not one that may pass."""
    from agentguard.stores._schema import create_schema

    class Terminated:
        async def exec_driver_sql(self, sql: str) -> None:
            if sql == "ROLLBACK":
                raise RuntimeError("Can't reconnect until invalid transaction is rolled back")

        async def run_sync(self, fn: object, **kw: object) -> None:
            raise ConnectionResetError("terminating connection due to administrator command")

    with pytest.raises(ConnectionResetError):
        asyncio.run(create_schema(Terminated(), "BEGIN", None, []))  # type: ignore[arg-type]
