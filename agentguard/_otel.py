"""OpenTelemetry, when the application uses it: a span per guarded call and the ``agentguard.*`` metrics.

Free when off. agentguard never imports ``opentelemetry`` by itself: a guarded call asks whether the
application has (``opentelemetry.trace`` in ``sys.modules``) and set a tracer or meter provider; if not, the
call does nothing more (one dictionary look-up). When it has, the instruments are made once from the global
providers, and every later call uses them. ``agentguard.otel.instrument()`` names providers explicitly (or
switches telemetry on or off for good).

What is recorded (never argument values), by the OpenTelemetry GenAI semantic conventions for tool execution
where they name the thing, and under ``agentguard.`` where only agentguard knows it:

- a span per guarded call, ``execute_tool <tool>`` (kind INTERNAL), a child of the caller's current span (the
  framework's own ``execute_tool`` span, the MCP SDK's ``tools/call`` span) and the parent of whatever the body
  does, with ``gen_ai.operation.name`` (``execute_tool``), ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` (the
  host's id of the call, where it has one), ``error.type`` (the class of what the call raised; status ERROR),
  ``agentguard.outcome`` (``ran``, ``took_over``, ``replayed``, ``refused``, ``released``, ``lease_lost``,
  ``unknown``, ``not_stored``), ``agentguard.outcome.detail``, ``agentguard.replayed``, ``agentguard.attempt``,
  ``agentguard.scope``, ``agentguard.task_id``, ``agentguard.key``;
- ``agentguard.calls`` (counter; attributes ``gen_ai.tool.name``, ``agentguard.outcome``, ``error.type``);
- ``agentguard.guard.duration`` (histogram, seconds: the guard's own time in a call, excluding the body and
  waiting; same attributes) and ``agentguard.wait.duration`` (histogram, seconds: waiting for another caller
  of the key; ``gen_ai.tool.name``), both with the bucket boundaries of ``DURATION_BUCKETS``;
- ``agentguard.ledger.dropped`` (counter: ledger entries dropped because the store did not keep up or refused
  them).
"""

from __future__ import annotations

import sys
from typing import Any

SCOPE_NAME = "agentguard"

# The SDK's default boundaries (0, 5, 10, 25 ... 10000) suit milliseconds, not seconds: every call would land
# in the first bucket. A guard's own time runs from a tenth of a millisecond (a replay from the cache) to tens of
# milliseconds; a wait lasts as long as another caller's tool body, up to a minute.
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)

# The GenAI semantic conventions' names (opentelemetry-semantic-conventions is not a dependency: four strings).
OPERATION = "gen_ai.operation.name"
EXECUTE_TOOL = "execute_tool"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
ERROR_TYPE = "error.type"


class Telemetry:
    """The tracer and instruments, made once from given (or the global) providers."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import context, metrics, trace

        from . import __version__ as _version

        self.trace, self.context = trace, context
        self.tracer = trace.get_tracer(SCOPE_NAME, _version, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE_NAME, _version, meter_provider=meter_provider)
        self.calls = meter.create_counter("agentguard.calls", unit="{call}",
                                          description="guarded calls, by tool and outcome")
        self.guard_time = meter.create_histogram(
            "agentguard.guard.duration", unit="s",
            description="the guard's own time in a call, excluding the body and waiting",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.wait_time = meter.create_histogram(
            "agentguard.wait.duration", unit="s", description="time a call waited for another caller of its key",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.dropped = meter.create_counter(
            "agentguard.ledger.dropped", unit="{entry}",
            description="attempt-ledger entries dropped because the store did not keep up or refused them")
        self.error = trace.StatusCode.ERROR
        self.internal = trace.SpanKind.INTERNAL

    def start(self, tool: str, call_id: str | None) -> tuple[Any, Any]:
        """A span for a call of ``tool``, made current (the body's spans are its children); and the token.

        What a sampler may decide on is set at the start: the operation, the tool, the host's call id."""
        attributes = {OPERATION: EXECUTE_TOOL, TOOL_NAME: tool}
        if call_id is not None:
            attributes[TOOL_CALL_ID] = call_id
        span = self.tracer.start_span(f"{EXECUTE_TOOL} {tool}", kind=self.internal, attributes=attributes)
        return span, self.context.attach(self.trace.set_span_in_context(span))

    def end(self, span: Any, token: Any, attributes: dict[str, Any], failed: str | None, tool: str, outcome: str,
            guard_s: float, wait_s: float) -> None:
        """``failed``: the class of what the call raised (``error.type``), None if it returned."""
        self.context.detach(token)
        span.set_attributes(attributes)
        labels = {TOOL_NAME: tool, "agentguard.outcome": outcome}
        if failed is not None:
            span.set_attribute(ERROR_TYPE, failed)
            span.set_status(self.error, failed)
            labels[ERROR_TYPE] = failed
        span.end()
        self.calls.add(1, labels)
        self.guard_time.record(guard_s, labels)
        if wait_s > 0:
            self.wait_time.record(wait_s, {TOOL_NAME: tool})


_forced: Telemetry | None = None
_off = False
_global: Telemetry | None = None


def current() -> Telemetry | None:
    """The telemetry in force: ``instrument()``'s, else the global providers' if the application set one."""
    if _forced is not None:
        return _forced
    if _global is not None or _off:
        return _global
    otel = sys.modules.get("opentelemetry.trace")
    if otel is None:
        return None
    return _from_globals(otel)


def _from_globals(otel: Any) -> Telemetry | None:
    global _global
    tracing = getattr(otel, "_TRACER_PROVIDER", None) is not None
    metrics = sys.modules.get("opentelemetry.metrics._internal")
    metering = metrics is not None and getattr(metrics, "_METER_PROVIDER", None) is not None
    if not (tracing or metering):
        return None
    _global = Telemetry()  # the API's global providers (proxies until both are set: they follow them)
    return _global


def inject(carrier: dict[str, Any]) -> None:
    """Put the current trace context (``traceparent``, ``tracestate``) into ``carrier`` (an MCP ``_meta``), when
    telemetry is on: the upstream's spans then follow the guarded call's. Off, ``carrier`` is left as it is."""
    if current() is not None:
        from opentelemetry.propagate import inject as into

        into(carrier)


def instrument(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Use these providers (or the global ones) from now on, whatever the global state."""
    global _forced, _off
    from ._extras import require

    require("opentelemetry", extra="otel", by="agentguard.otel.instrument()")
    _forced, _off = Telemetry(tracer_provider, meter_provider), False


def uninstrument() -> None:
    """No telemetry from now on, even if the application sets global providers."""
    global _forced, _global, _off
    _forced, _global, _off = None, None, True


def reset() -> None:
    """Back to the default: follow the application's global providers."""
    global _forced, _global, _off
    _forced, _global, _off = None, None, False
