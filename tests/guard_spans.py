"""The guarded calls' spans of a test, collected in memory: agentguard's telemetry pointed at an SDK tracer
provider for the duration (``agentguard.otel.instrument``), then back to the default."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentguard.otel import instrument, reset


class Spans:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()

    def calls(self, tool: str) -> list[tuple[str, object]]:
        """(outcome, gen_ai.tool.call.id or None) of each guarded call of ``tool``, in the order they ended."""
        return [(str(s.attributes["agentguard.outcome"]), s.attributes.get("gen_ai.tool.call.id"))
                for s in self.guarded(tool)]

    def guarded(self, tool: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans()
                if s.instrumentation_scope is not None and s.instrumentation_scope.name == "agentguard"
                and s.attributes is not None and s.attributes.get("gen_ai.tool.name") == tool]


@contextlib.contextmanager
def guard_spans() -> Iterator[Spans]:
    spans = Spans()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans.exporter))
    instrument(tracer_provider=provider, meter_provider=MeterProvider())
    try:
        yield spans
    finally:
        reset()
        provider.shutdown()
