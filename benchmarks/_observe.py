"""What observing a guarded call costs the caller, side by side over the no-I/O stand-in store (so only the
guard's own Python work shows): telemetry off (as with no OpenTelemetry installed), the OpenTelemetry API
imported but no provider set, the SDK with a tracer and a meter provider and a span exporter, and the ledger
of attempts kept (its writer on the guard's portal thread, over a store that accepts the entries at once).
Each ratio is against telemetry off, for first calls and for cached replays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentguard import Guard, task
from agentguard import _otel as otel_state

from ._common import AMOUNT, Body, NoIOStore, guarded, run_id
from ._harness import Stat, Variant, run_group

Log = Callable[[str], None]
CACHED = 64


class LedgerNoIO(NoIOStore):
    """The no-I/O stand-in with the ledger's write verb: entries accepted at once (and counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.entries = 0

    async def write_attempts(self, rows: Sequence[Sequence[Any]]) -> None:
        self.entries += len(rows)

    async def read_attempts(self, **kw: Any) -> list[Any]:
        return []

    async def sweep_attempts(self, batch: int = 1000) -> int:
        return 0

    async def verify_ledger(self, scope: str | None = None) -> list[Any]:
        return []

    async def record_details(self, key: str, scope: str | None = None) -> list[Any]:
        return []

    async def forget(self, scope: str, key: str) -> bool:
        return False

    async def task_known(self, task_id: str) -> bool:
        return False


def _sdk() -> Callable[[], None] | None:
    """Switches telemetry to an SDK tracer provider (spans to an exporter that drops them) and meter provider
    (an in-memory reader); None if the SDK is not installed."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return None

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(Dropped()))
    telemetry = otel_state.Telemetry(tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()]))

    def on() -> None:
        otel_state._forced, otel_state._off = telemetry, False

    return on


def _off() -> None:
    otel_state._forced, otel_state._global, otel_state._off = None, None, True


def _no_provider() -> None:
    otel_state._forced, otel_state._global, otel_state._off = None, None, False


async def observability(*, n: int, reps: int, warmup: int, log: Log) -> tuple[dict[str, Stat], list[str]]:
    sdk = _sdk()
    rid, orders = run_id(), [f"o-{i}" for i in range(max(n, warmup, CACHED))]
    tids: dict[str, str] = {}
    guards: list[Guard] = []
    ledger_store = LedgerNoIO()

    def variant(name: str, switch: Callable[[], None], *, cached: bool, ledger: bool = False, ref: str = ""
                ) -> Variant:
        g = Guard(store=ledger_store if ledger else NoIOStore())
        guards.append(g)
        tool = guarded(g, Body())

        async def call(i: int) -> None:
            switch()
            with task(tids[name]):
                await tool(orders[i % CACHED] if cached else orders[i], AMOUNT)

        async def prepare(rep: int, k: int) -> None:
            if cached:
                if rep == -1:  # completed once; every later call replays one of them from the cache
                    tids[name] = f"obs-{rid}-{name}"
                    for i in range(CACHED):
                        await call(i)
            else:
                tids[name] = f"obs-{rid}-{name}-{rep}"

        return Variant(name, call, prepare, ref)

    variants = []
    for path, cached in (("first call", False), ("cached replay", True)):
        base = f"{path}: telemetry off"
        variants += [variant(base, _off, cached=cached),
                     variant(f"{path}: OTel API, no provider", _no_provider, cached=cached, ref=base)]
        if sdk is not None:
            variants.append(variant(f"{path}: OTel SDK, spans exported", sdk, cached=cached, ref=base))
        variants.append(variant(f"{path}: ledger kept", _off, cached=cached, ledger=True, ref=base))
    try:
        stats = await run_group(variants, n=n, reps=reps, warmup=warmup, callers=1, log=log)
    finally:
        for g in guards:
            await g.aclose()
        otel_state.reset()
    notes = [] if sdk is not None else ["the OpenTelemetry SDK is not installed: its variants were skipped"]
    if ledger_store.entries == 0:
        notes.append("INVALID: the ledger kept no entry")
    return stats, notes
