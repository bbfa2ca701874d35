"""A task's timeline as an SVG picture: one row per operation, time running left to right.

A row has spans (a claim held from when it was taken until its outcome was stored, or until now while it
runs) and marks (a step written, an attempt that replayed, was refused, took over ...), each coloured by its
kind and titled (a browser shows the title on hover; no script is needed to read the picture). Rows link to
their record's page. What goes in the rows is the caller's (:func:`rows_of_records`); this module only draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from ..stores._views import RecordRow

# kind -> (fill colour, what the legend calls it)
KINDS: dict[str, tuple[str, str]] = {
    "succeeded": ("#2e7d32", "succeeded"),
    "failed": ("#c62828", "failed"),
    "running": ("#1565c0", "running"),
    "released": ("#8d8d8d", "released"),
    "held": ("#ef6c00", "held: unknown outcome"),
    "step": ("#37474f", "step done"),
    "unknown": ("#ef6c00", "step of unknown outcome"),
}

WIDTH, LABEL, ROW, TOP, PAD = 960, 260, 30, 30, 16


@dataclass(frozen=True, slots=True)
class Span:
    start: float
    end: float
    kind: str
    title: str


@dataclass(frozen=True, slots=True)
class Mark:
    at: float
    kind: str
    title: str


@dataclass(slots=True)
class Row:
    label: str
    href: str
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


def _seconds(s: float) -> str:
    if s == 0:
        return "0"
    if abs(s) < 1:
        return f"{s * 1000:.0f} ms"
    if abs(s) < 120:
        return f"{s:.3g} s"
    if abs(s) < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def _tick_step(span: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving four to ten ticks over ``span``."""
    raw = span / 6
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= raw)


def rows_of_records(records: Sequence[RecordRow], now: float, href: dict[str, str]) -> list[Row]:
    """The fallback picture, from records and steps alone: a record's claim as a span from its first claim to
    its last change (to now while its lease is live), its steps as marks when they were last written."""
    rows = []
    for r in records:
        kind = "held" if r.held else r.state
        end = now if r.live else r.updated
        title = f"{r.operation}: {kind}, {r.attempts} attempt(s), {_seconds(end - r.created)}"
        row = Row(r.operation, href[r.key], spans=[Span(r.created, end, kind, title)])
        for s in r.steps:
            unknown = r.held and s.state == "started"
            row.marks.append(Mark(s.at, "unknown" if unknown else "step",
                                  f"step {s.name}: {'unknown outcome' if unknown else s.state}"))
        rows.append(row)
    return rows


def svg(rows: Sequence[Row], *, title: str) -> str:
    """The picture of ``rows`` on one time axis, from the earliest start to the latest end."""
    times = [t for r in rows for t in (*(x for s in r.spans for x in (s.start, s.end)), *(m.at for m in r.marks))]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    span = max(t1 - t0, 1e-3)
    plot = WIDTH - LABEL - 2 * PAD
    used = {s.kind for r in rows for s in r.spans} | {m.kind for r in rows for m in r.marks}
    height = TOP + ROW * len(rows) + 24 + (22 if used else 0)

    def x(t: float) -> float:
        return LABEL + PAD + (t - t0) / span * plot

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12" class="timeline">',
           f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fff"/>']
    step = _tick_step(span)
    k = 0
    while k * step <= span + 1e-9:
        tx = x(t0 + k * step)
        out.append(f'<line x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{TOP + ROW * len(rows)}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{tx:.1f}" y="{TOP - 10}" text-anchor="middle" fill="#555">+{_seconds(k * step)}</text>')
        k += 1
    for i, r in enumerate(rows):
        y = TOP + i * ROW
        label = r.label if len(r.label) <= 36 else r.label[:35] + "…"
        out.append(f'<a href="{escape(r.href)}"><text x="8" y="{y + ROW / 2 + 4}" fill="#1a237e">'
                   f"<title>{escape(r.label)}</title>{escape(label)}</text></a>")
        for s in r.spans:
            x1, x2 = x(s.start), max(x(s.end), x(s.start) + 3)
            out.append(f'<rect x="{x1:.1f}" y="{y + 7}" width="{x2 - x1:.1f}" height="{ROW - 14}" rx="3" '
                       f'fill="{KINDS.get(s.kind, ("#999", ""))[0]}" class="span {escape(s.kind)}">'
                       f"<title>{escape(s.title)}</title></rect>")
        for m in r.marks:
            mx, my = x(m.at), y + ROW / 2
            out.append(f'<path d="M{mx:.1f},{my - 7} l6,7 l-6,7 l-6,-7 z" fill="{KINDS.get(m.kind, ("#999", ""))[0]}"'
                       f' stroke="#fff" class="mark {escape(m.kind)}"><title>{escape(m.title)}</title></path>')
    ly, lx = TOP + ROW * len(rows) + 26, 8.0
    for kind, (colour, name) in KINDS.items():
        if kind in used:
            out.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" rx="2" fill="{colour}"/>'
                       f'<text x="{lx + 16}" y="{ly}" fill="#333">{escape(name)}</text>')
            lx += 28 + 7 * len(name)
    out.append("</svg>")
    return "\n".join(out)
