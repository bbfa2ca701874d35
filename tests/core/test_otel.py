"""OpenTelemetry: a span per guarded call (child of the caller's, parent of the body's) named and described by
the GenAI semantic conventions for tool execution, the ``agentguard.*`` metrics with bucket boundaries for
calls of a millisecond to a minute, the application's global providers followed with no agentguard code,
nothing imported or done when off, and the MCP proxy continuing the host's trace into the upstream call. The
SDK's in-memory exporter and metric reader collect what is recorded."""

from __future__ import annotations

import json
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
        return [s for s in self.spans.get_finished_spans() if s.instrumentation_scope.name == "agentguard"]


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
    assert [s.name for s in spans] == ["execute_tool charge"] * 3
    assert {s.kind.name for s in spans} == {"INTERNAL"}
    outcome = [(s.attributes["agentguard.outcome"], s.attributes["agentguard.replayed"]) for s in spans]
    assert outcome == [("ran", False), ("replayed", True), ("refused", False)]
    assert spans[2].attributes["agentguard.outcome.detail"] == "reuse (differing: amount)"
    assert spans[2].status.status_code.name == "ERROR" and spans[0].status.status_code.name == "UNSET"
    assert [s.attributes.get("error.type") for s in spans] == [None, None, "KeyReuseError"]
    parent = turn.get_span_context()
    assert all(s.parent is not None and s.parent.span_id == parent.span_id for s in spans)
    assert {s.context.trace_id for s in spans} == {parent.trace_id}
    body = next(s for s in otel.spans.get_finished_spans() if s.name == "provider call")
    assert body.parent is not None and body.parent.span_id == spans[0].context.span_id
    for s in spans:  # the conventions' names, agentguard's own under its prefix; identity, never argument values
        attrs = dict(s.attributes or {})
        assert attrs["gen_ai.operation.name"] == "execute_tool" and attrs["gen_ai.tool.name"] == "charge"
        assert "gen_ai.tool.call.id" not in attrs  # a plain decorated call has no host call id
        assert attrs["agentguard.task_id"] == t and attrs["agentguard.scope"] == "default"
        assert attrs["agentguard.key"].startswith("ag_")
        assert all(name.startswith("agentguard.") or name in CONVENTIONS for name in attrs)
        # the task id and key are random (either may contain "100"): the argument values are sought in the rest
        fixed = [str(v) for k, v in attrs.items() if k not in ("agentguard.task_id", "agentguard.key")]
        assert not [v for v in fixed if "o-1" in v or "100" in v], fixed
    m = otel.metrics()
    assert all(name.startswith("agentguard.") for name in m)
    calls = {(a["gen_ai.tool.name"], a["agentguard.outcome"], a.get("error.type")): p.value
             for a, p in m["agentguard.calls"]}
    assert calls == {("charge", "ran", None): 1, ("charge", "replayed", None): 1,
                     ("charge", "refused", "KeyReuseError"): 1}
    assert sum(p.count for _, p in m["agentguard.guard.duration"]) == 3


CONVENTIONS = {"gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "error.type"}
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0, 60.0)


async def test_the_hosts_tool_call_id_and_a_failed_calls_error_type_are_on_the_span(
    make_guard: Callable[..., Guard], otel: Telemetry
) -> None:
    g = make_guard()

    class Declined(Exception):
        pass

    async def declined(_key: str) -> str:
        raise Declined("card declined")

    async def paid(_key: str) -> str:
        return "paid"

    t = tid()
    with pytest.raises(Declined):  # released, not stored: the same call runs again
        await g.run("pay", declined, task_id=t, audit={"tool_call_id": "call_1"})
    assert await g.run("pay", paid, task_id=t, audit={"tool_call_id": "call_2"}) is not None
    failed, ran = otel.guard_spans()
    assert failed.attributes["gen_ai.tool.call.id"] == "call_1" and ran.attributes["gen_ai.tool.call.id"] == "call_2"
    assert failed.attributes["agentguard.outcome"] == "released"
    assert failed.attributes["error.type"] == Declined.__qualname__  # the class, never its message
    assert failed.status.status_code.name == "ERROR" and "card declined" not in str(failed.status.description)
    assert "error.type" not in ran.attributes and ran.status.status_code.name == "UNSET"
    labels = {(a["agentguard.outcome"], a.get("error.type")) for a, _ in otel.metrics()["agentguard.calls"]}
    assert labels == {("released", failed.attributes["error.type"]), ("ran", None)}


async def test_durations_are_bucketed_from_a_tenth_of_a_millisecond_to_a_minute(
    make_guard: Callable[..., Guard], otel: Telemetry
) -> None:
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
        await waiting.wait()
        release.set()
        await asyncio.gather(first, second)
    m = otel.metrics()
    for name in ("agentguard.guard.duration", "agentguard.wait.duration"):
        points = [p for _, p in m[name]]
        assert points and all(tuple(p.explicit_bounds) == BUCKETS for p in points), name
        assert all(sum(p.bucket_counts) == p.count for p in points)


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
    assert got["spans"] == [["execute_tool send", "ran"], ["execute_tool send", "replayed"]]
    assert got["metrics"] == ["agentguard.calls", "agentguard.guard.duration"]


@pytest.mark.skipif(BACKEND != "sqlite", reason="independent of the store's backend")
def test_off_imports_nothing_of_opentelemetry(tmp_path: Any) -> None:
    report = "    print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))"
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(setup="", report=report),
                          f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
