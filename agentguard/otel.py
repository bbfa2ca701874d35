"""OpenTelemetry for guarded calls (the ``otel`` extra: ``opentelemetry-api`` only).

Nothing to call in the usual case: configure OpenTelemetry as usual (``set_tracer_provider``,
``set_meter_provider``, or ``opentelemetry-instrument``) and every guarded call becomes a span, child of the
caller's current span, with the ``agentguard.*`` metrics (see ``docs/observability.md``). With no provider
set, or the API not installed, a guarded call does no telemetry work at all and agentguard imports nothing of
OpenTelemetry.

:func:`instrument` names providers explicitly (tests, an application with several); :func:`uninstrument`
turns telemetry off even when global providers are set; :func:`reset` returns to following the globals.
"""

from __future__ import annotations

from ._otel import instrument, reset, uninstrument

__all__ = ["instrument", "reset", "uninstrument"]
