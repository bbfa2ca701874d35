"""OpenTelemetry: a span per guarded call (child of the caller's, parent of the body's), the ``agentguard.*``
metrics, the application's global providers followed with no agentguard code, nothing imported or done when
off, and the MCP proxy continuing the host's trace into the upstream call. The SDK's in-memory exporter and
metric reader collect what is recorded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentguard import Guard, KeyReuseError, task
from agentguard.otel import instrument, reset

from conftest import BACKEND, tid

pytestmark = pytest.mark.anyio


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("test")

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        out.setdefault(m.name, []).append((dict(p.attributes or {}), p))
        return out

    def guard_spans(self) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith("agentguard ")]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    t = Telemetry()
    instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    yield t
    reset()


async def test_a_span_per_call_child_of_the_callers_parent_of_the_bodys(
    make_guard: Callable[..., Guard], otel: Telemetry
) -> None:
    g = make_guard()
    runs = 0

    @g.once(key=["order"])
    async def charge(order: str, amount: int) -> str:
        nonlocal runs
        runs += 1
        with otel.tracer.start_as_current_span("provider call"):
            return f"ch-{runs}"

    t = tid()
    with otel.tracer.start_as_current_span("agent turn") as turn, task(t):
        await charge("o-1", 100)
        await charge("o-1", 100)
        with pytest.raises(KeyReuseError):
            await charge("o-1", 5)
    spans = otel.guard_spans()
    assert [s.name for s in spans] == ["agentguard charge"] * 3
    outcome = [(s.attributes["agentguard.outcome"], s.attributes["agentguard.replayed"]) for s in spans]
    assert outcome == [("ran", False), ("replayed", True), ("refused", False)]
    assert spans[2].attributes["agentguard.outcome.detail"] == "reuse (differing: amount)"
    assert spans[2].status.status_code.name == "ERROR" and spans[0].status.status_code.name == "UNSET"
    parent = turn.get_span_context()
    assert all(s.parent is not None and s.parent.span_id == parent.span_id for s in spans)
    assert {s.context.trace_id for s in spans} == {parent.trace_id}
    body = next(s for s in otel.spans.get_finished_spans() if s.name == "provider call")
    assert body.parent is not None and body.parent.span_id == spans[0].context.span_id
    for s in spans:  # identity, never argument values
        attrs = dict(s.attributes or {})
        assert attrs["agentguard.task_id"] == t and attrs["agentguard.scope"] == "default"
        assert attrs["agentguard.key"].startswith("ag_") and attrs["agentguard.tool"] == "charge"
        values = [v for k, v in attrs.items() if k not in ("agentguard.task_id", "agentguard.key")]
        assert not {"o-1", 100, "100"} & set(values), values  # the id and key are random: judged apart
    m = otel.metrics()
    calls = {(a["agentguard.tool"], a["agentguard.outcome"]): p.value for a, p in m["agentguard.calls"]}
    assert calls == {("charge", "ran"): 1, ("charge", "replayed"): 1, ("charge", "refused"): 1}
    assert sum(p.count for _, p in m["agentguard.guard.duration"]) == 3


async def test_waiting_is_measured_apart(make_guard: Callable[..., Guard], otel: Telemetry) -> None:
    import asyncio

    holding, release, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    g = make_guard(on_event=lambda e: waiting.set() if e.kind == "waiting" else None)

    @g.once
    async def slow() -> str:
        holding.set()
        await release.wait()
        return "done"

    with task(tid()):
        first = asyncio.create_task(slow())
        await holding.wait()
        second = asyncio.create_task(slow())
        await waiting.wait()  # the second call waits for the first
        release.set()
        assert await first == await second == "done"
    outcomes = sorted(s.attributes["agentguard.outcome"] for s in otel.guard_spans())
    assert outcomes == ["ran", "replayed"]
    waits = otel.metrics()["agentguard.wait.duration"]
    assert sum(p.count for _, p in waits) == 1


SCRIPT = """
import asyncio, json, sys
{setup}
from agentguard import Guard, task

async def main():
    async with Guard(sys.argv[1]) as g:
        @g.once
        async def send() -> str:
            return "sent"
        with task("t-1"):
            await send()
            await send()
{report}
asyncio.run(main())
"""

GLOBAL_SETUP = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
"""

GLOBAL_REPORT = """
    names = [m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics]
    print(json.dumps({"spans": [[s.name, s.attributes["agentguard.outcome"]] for s in spans.get_finished_spans()],
                      "metrics": sorted(names)}))
"""


@pytest.mark.skipif(BACKEND != "sqlite", reason="independent of the store's backend")
def test_the_applications_global_providers_are_followed_with_no_agentguard_code(tmp_path: Any) -> None:
    code = SCRIPT.format(setup=GLOBAL_SETUP, report=GLOBAL_REPORT)
    out = subprocess.run([sys.executable, "-c", code, f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["spans"] == [["agentguard send", "ran"], ["agentguard send", "replayed"]]
    assert got["metrics"] == ["agentguard.calls", "agentguard.guard.duration"]


@pytest.mark.skipif(BACKEND != "sqlite", reason="independent of the store's backend")
def test_off_imports_nothing_of_opentelemetry(tmp_path: Any) -> None:
    report = "    print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))"
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(setup="", report=report),
                          f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
