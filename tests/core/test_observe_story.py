"""The closing scenario of the observability work: a scripted agent loop — a retry after a transient error, a
parallel duplicate, a worker process SIGKILLed mid-call and taken over, a refused reuse, a replay — and the
spans, the metrics, the ledger and ``agentguard timeline`` all tell the same story, on the suite's backend."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentguard import Guard, GuardEvent, KeyReuseError, task
from agentguard.otel import instrument, reset

from conftest import tid

pytestmark = pytest.mark.slow

WORKER = str(Path(__file__).resolve().parents[1] / "proc_worker.py")
O1, O2, O3 = 'charge[order_id="o-1"]', 'charge[order_id="o-2"]', 'charge[order_id="o-3"]'

# (operation, kind) in the order the agent's calls ended
STORY = [
    (O2, "released"),   # a transient provider error: the claim is released
    (O2, "ran"),        # the agent retries: attempt 2 runs
    (O3, "ran"),        # two identical calls in parallel: one runs...
    (O3, "replayed"),   # ...the other waits and replays it
    (O1, "took_over"),  # a worker was SIGKILLed inside o-1: its claim is taken over, same downstream key
    (O1, "refused"),    # the same order with another amount: refused, not run
    (O1, "replayed"),   # asked again: replayed
]


def test_spans_metrics_ledger_and_timeline_tell_the_same_story(store_url: str, tmp_path: Path) -> None:
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    t, effects = tid(), tmp_path / "effects"
    kill_a_worker_inside_o1(store_url, t, effects)
    instrument(tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        took, ledger = asyncio.run(agent_loop(store_url, t, effects))
    finally:
        reset()

    # The side effects: o-1 twice (the killed worker's and the takeover's) under one downstream key.
    lines = effects.read_text().split()
    assert len(lines) == 4 and lines.count(took["key"]) == 2

    # The ledger also keeps the killed worker's attempt (its process died with its own entry): written by the
    # takeover, just before its own; spans and metrics tell of calls made here only.
    gone = [e for e in ledger if e.kind == "went_away"]
    assert [(e.operation, e.attempt, e.id > 0) for e in gone] == [(O1, 1, True)]
    assert ledger.index(gone[0]) == 4 and "taken over by attempt 2" in gone[0].detail
    ledger = [e for e in ledger if e.kind != "went_away"]
    assert [(e.operation, e.kind) for e in ledger] == STORY
    assert [e.attempt for e in ledger] == [1, 2, 1, 1, 2, 0, 2]
    assert ledger[4].detail == "succeeded (after a running claim)"

    out = subprocess.run([sys.executable, "-m", "agentguard.cli", "timeline", t, "--url", store_url, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    told = [(a["operation"], a["kind"]) for a in json.loads(out.stdout)["attempts"]]
    assert told == [*STORY[:4], (O1, "went_away"), *STORY[4:]]
    text = subprocess.run([sys.executable, "-m", "agentguard.cli", "timeline", t, "--url", store_url],
                          capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert [line.split()[2] for line in text] == ["RELEASE", "ran", "ran", "REPLAY", "GONE", "TAKEOVR", "REFUSED",
                                                  "REPLAY"]

    finished = [s for s in spans.get_finished_spans() if s.name == "execute_tool charge"]
    by_key = {e.key: e.operation for e in ledger}
    assert [(by_key[s.attributes["agentguard.key"]], s.attributes["agentguard.outcome"]) for s in finished] == STORY
    assert [s.attributes["agentguard.attempt"] for s in finished] == [e.attempt for e in ledger]

    data = reader.get_metrics_data()
    counted: collections.Counter[str] = collections.Counter()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "agentguard.calls":
                    for p in m.data.data_points:
                        counted[str((p.attributes or {})["agentguard.outcome"])] += int(p.value)
    assert counted == collections.Counter(kind for _, kind in STORY)


def kill_a_worker_inside_o1(store_url: str, t: str, effects: Path) -> None:
    """A worker process claims o-1 of the task (lease 0.5 s) and is SIGKILLed inside the body."""
    worker = subprocess.Popen([sys.executable, WORKER, store_url, t, str(effects), "hang", "--lease", "0.5",
                               "--sleep", "120"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready"
    worker.stdin.write("go\n")
    worker.stdin.flush()
    assert worker.stdout.readline().strip() == "started"
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=30)
    assert worker.returncode == -signal.SIGKILL


async def agent_loop(store_url: str, t: str, effects: Path) -> tuple[dict[str, Any], list[Any]]:
    holding, release, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    failed_once: set[str] = set()

    def on_event(e: GuardEvent) -> None:
        if e.kind == "waiting":
            waiting.set()

    guard = Guard(store_url, lease=10, on_event=on_event)  # (o-3 stays its holder's however slow the machine)

    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
        if order_id == "o-2" and order_id not in failed_once:
            failed_once.add(order_id)
            raise ConnectionError("provider timed out")
        with open(effects, "a") as f:  # noqa: ASYNC230 - the side effect itself
            f.write(idempotency_key + "\n")
        if order_id == "o-3":
            holding.set()
            await release.wait()
        return {"order_id": order_id, "amount_cents": amount_cents, "key": idempotency_key}

    try:
        with task(t):
            with pytest.raises(ConnectionError):
                await charge("o-2", 100)
            await charge("o-2", 100)  # the agent's retry
            first = asyncio.create_task(charge("o-3", 300))
            await holding.wait()
            second = asyncio.create_task(charge("o-3", 300))
            await waiting.wait()
            release.set()
            assert await first == await second
            took = await charge("o-1", 4900)  # waits out the dead worker's lease, then takes over
            with pytest.raises(KeyReuseError):
                await charge("o-1", 5000)
            assert await charge("o-1", 4900) == took
    finally:
        await guard.aclose()  # flushes the ledger

    reader_guard = Guard(store_url)
    try:
        return took, await reader_guard.timeline(t)
    finally:
        await reader_guard.aclose()
