"""The chaos run's own checks (``chaos/``): its provider honours keys, its verdict catches every broken
outcome it promises to catch, and a fleet of each kind of worker (async tools, a sync tool from threads, a
sync tool alone, async callers gathered) makes its calls on the test's store. The run itself (``python -m chaos
--short``) is part of ``scripts/test.sh``."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from chaos.__main__ import GATHERED_ROUNDS, Fleet, Plan
from chaos._judge import judge
from chaos._provider import Provider, ProviderError, charge, charge_sync
from chaos._worker import GATHERED_CALLERS

storeless = pytest.mark.storeless  # independent of the store's backend

OPS = [("t-0", "charge", "o0", 100), ("t-1", "book", "o1", 101)]
STORED = {"t-0": {"order": "o0", "charge": "ch_1"}, "t-1": {"order": "o1", "charge": "ch_2"}}


def _stats(charges: dict[str, list[str]] | None = None, keys: dict[str, list[str]] | None = None) -> dict[str, object]:
    return {"charges": charges or {"o0": ["ch_1"], "o1": ["ch_2"]}, "keys": keys or {"o0": ["k0"], "o1": ["k1"]},
            "requests": 2, "replayed": 0}


def _lines(*entries: dict[str, object]) -> str:
    return "\n".join(json.dumps(e) for e in entries)


GOOD = _lines({"event": "takeover", "task": "t-0"}, {"op": "t-0", "result": STORED["t-0"]},
              {"op": "t-1", "error": "InProgressError", "body_ran": False}, {"op": "t-1", "result": STORED["t-1"]})


@storeless
def test_a_clean_run_passes() -> None:
    v = judge(OPS, _stats(), STORED, [], [(0, GOOD), (1, GOOD + '\n{"op": "t-1", "res')])  # a line cut by a kill
    assert v.problems == [] and v.calls == 6 and v.charges == 2 and v.events["takeover"] == 2


@storeless
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


SYNC_GOOD = _lines({"own_connection": "sqlite3", "thread": "caller-0"}, {"body": "o0", "tools": "sync"},
                   {"op": "t-0", "result": STORED["t-0"]})  # a sync tool's worker: it books nothing


@storeless
def test_sync_workers_are_judged_on_the_calls_they_make() -> None:
    v = judge(OPS, _stats(), STORED, [], [(0, GOOD), (1, SYNC_GOOD), (2, SYNC_GOOD)],
              expected={0: {"t-0", "t-1"}, 1: {"t-0"}, 2: {"t-0"}}, kinds={0: "async", 1: "threads", 2: "sync"},
              own_threads=True)
    assert v.problems == [] and v.by_kind == {"async": 3, "threads": 1, "sync": 1}
    assert v.bodies == {"threads": 1, "sync": 1} and v.own == {"threads": 1, "sync": 1}


@storeless
@pytest.mark.parametrize(("results", "own_threads", "said"), [
    (_lines({"op": "t-0", "error": "InProgressError"}), False, "worker 1 has no answer for 1 operations"),
    (_lines({"op": "t-0", "result": {"order": "o0", "charge": "ch_3"}}), False, "worker 1 got"),
    (_lines({"op": "t-0", "error": "OutcomeUnknownError", "unexpected": "held"}), False, "OutcomeUnknownError"),
    (_lines({"op": "t-0", "result": STORED["t-0"]}), True, "threads workers' sync tools never claimed"),
])
def test_a_broken_sync_worker_is_caught(results: str, own_threads: bool, said: str) -> None:
    v = judge(OPS, _stats(), STORED, [], [(0, GOOD), (1, results)], expected={0: {"t-0", "t-1"}, 1: {"t-0"}},
              kinds={0: "async", 1: "threads"}, own_threads=own_threads)
    assert any(said in p for p in v.problems), v.problems


GATHERED_GOOD = GOOD + "\n" + _lines({"gathered": "claim", "callers": 3}, {"gathered": "complete", "callers": 2})


@storeless
@pytest.mark.parametrize(("results", "gathers", "said"), [
    (GATHERED_GOOD, True, None),
    (GOOD, False, None),  # (SQLite gathers nothing)
    (GOOD, True, "gathered workers' claims never went as one statement"),
    (GOOD + "\n" + _lines({"gathered": "claim", "callers": 3}), True,
     "gathered workers' completions never went as one statement"),
])
def test_gathered_workers_are_judged_on_their_statements_for_many_callers(results: str, gathers: bool,
                                                                           said: str | None) -> None:
    v = judge(OPS, _stats(), STORED, [], [(0, GOOD), (1, results)], kinds={0: "async", 1: "gathered"},
              gathers=gathers)
    if said is None:
        assert v.problems == [] and v.by_kind == {"async": 3, "gathered": 3}
    else:
        assert any(said in p for p in v.problems), v.problems


@storeless
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


@storeless
def test_the_sync_client_is_the_async_ones_twin() -> None:
    provider = Provider().start()
    try:
        first = charge_sync(provider.url, "k", "o0", 100)
        assert asyncio.run(charge(provider.url, "k", "o0", 100)) == {**first, "replayed": True}
        assert charge_sync(provider.url, "k", "o0", 100) == {**first, "replayed": True}
        with pytest.raises(ProviderError, match="400"):
            charge_sync(provider.url, "k", "o0", 999)
        assert provider.stats()["charges"] == {"o0": ["ch_1"]}
    finally:
        provider.stop()


@pytest.mark.slow
def test_a_fleet_of_every_kind_of_worker_makes_its_calls(store_url: str, tmp_path: Path) -> None:
    """Without faults: an async worker, a sync tool's worker with 3 threads, a sync tool's worker alone and a
    gathered worker (six async callers on a pool of one), on the test's store, each make every call of their
    scripts; one charge per operation, every answer the stored one (replayed async and sync), sync tools
    claiming in their own threads, and on Postgres the gathered worker's claims and completions gathered. No
    worker dies, so none is taken over: the lease is long (the chaos run's short one is for the workers it kills
    and stops, and a live worker starved of the CPU that long on a loaded machine would be taken over too)."""
    provider = Provider().start()
    try:
        backend = make_url(store_url).get_backend_name()
        outcome = Fleet(backend, store_url, provider, Plan(4, 6, 0.0, 120.0, threads=3, lease=30.0), random.Random(7),
                        tmp_path).run()
    finally:
        provider.stop()
    assert outcome.problems == [], outcome.problems
    summary = "\n".join(outcome.summary)
    ops = 6 + GATHERED_CALLERS * GATHERED_ROUNDS  # (the gathered worker's own operations too)
    assert f"{ops} operations" in summary and f"{ops} charges at the provider" in summary, summary
    assert "takeovers 0" in summary, summary
    if backend == "postgresql":
        assert "statements for many callers:" in summary, summary


