"""A task's timeline as an SVG picture: one row per operation, time running left to right.

A row has spans (a claim held from when it was taken until its outcome was stored, or until now while it
runs) and marks (a step written, an attempt that replayed, was refused, took over ...), each coloured by its
kind. Marks that would cover one another — attempts in the same millisecond, or close enough at the
picture's scale — are stacked in lanes, the row growing to hold them (beyond ``MAX_LANES``, a ``+N`` says how
many more are at that place). An attempt's mark links to its line in the page's table of attempts, which says
in words what the mark shows (no script is needed, and nothing is only in a hover title); rows link to their
record's page. :func:`rows_of_attempts` makes the rows of a task; :func:`svg` draws them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

from ..stores import Attempt
from ..stores._console import RecordRow

# kind -> (fill colour, what the legend calls it). Spans: a record's claim, by its state. Marks: a step, and
# (from the ledger of attempts) what each call of the operation came to, and an operator's acts.
SPANS: dict[str, tuple[str, str]] = {
    "succeeded": ("#2e7d32", "succeeded"),
    "failed": ("#c62828", "failed"),
    "running": ("#1565c0", "running"),
    "released": ("#8d8d8d", "released"),
    "held": ("#ef6c00", "held: unknown outcome"),
}
MARKS: dict[str, tuple[str, str]] = {
    "step": ("#37474f", "step done"),
    "step_unknown": ("#ef6c00", "step of unknown outcome"),
    "ran": ("#1b5e20", "ran"),
    "took_over": ("#6a1b9a", "took over"),
    "went_away": ("#d50000", "worker went away"),
    "replayed": ("#0d47a1", "replayed"),
    "refused": ("#455a64", "refused"),
    "released": ("#9e9e9e", "released (retry)"),
    "lease_lost": ("#b71c1c", "lease lost"),
    "unknown": ("#e65100", "held: unknown outcome"),
    "not_stored": ("#b71c1c", "result not stored"),
    "resolved": ("#000000", "resolved"),
    "forgotten": ("#000000", "forgotten"),
}
STEPS = ("step", "step_unknown")
OPERATOR = ("resolved", "forgotten")

WIDTH, LABEL, TOP, PAD = 960, 260, 30, 16
ROW = 30  # the height of a row of one lane
SIZE = 12  # a mark's width and height (a circle of radius 5.5, a diamond, a square), with its outline
LANE = SIZE + 3  # the height of a lane
MAX_LANES = 6  # lanes of marks in a row; marks beyond them are counted, not drawn


@dataclass(frozen=True, slots=True)
class Span:
    start: float
    end: float
    kind: str
    title: str
    faint: bool = False  # drawn behind marks that tell more (a claim under its attempts)


@dataclass(frozen=True, slots=True)
class Mark:
    at: float
    kind: str
    title: str
    waited: float = 0.0  # seconds spent waiting for another caller before ``at``: drawn as a whisker
    anchor: str | None = None  # the id of its line in the page's table of attempts


@dataclass(slots=True)
class Row:
    label: str
    href: str
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


def _seconds(s: float) -> str:
    if s == 0:
        return "0"
    if abs(s) < 1:  # (a burst's axis is a few milliseconds long: 0.5 ms, not a second "+0")
        return f"{s * 1000:.3g} ms"
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


def _claim(r: RecordRow, now: float, faint: bool) -> Span:
    kind = "held" if r.held else r.state
    end = now if r.live else r.updated
    title = f"{r.operation}: {kind}, {r.attempts} attempt(s), {_seconds(end - r.created)} from claim to last change"
    return Span(r.created, end, kind, title, faint)


def _steps(r: RecordRow) -> list[Mark]:
    marks = []
    for s in r.steps:
        unknown = r.held and s.state == "started"
        marks.append(Mark(s.at, "step_unknown" if unknown else "step",
                          f"step {s.name}: {'unknown outcome' if unknown else s.state}"))
    return marks


def anchor(n: int) -> str:
    """The id of the ``n``-th line of a page's table of attempts (counted from 1)."""
    return f"a{n}"


def rows_of_attempts(records: Sequence[RecordRow], attempts: Sequence[Attempt], now: float,
                     href: Callable[[str], str]) -> list[Row]:
    """The picture: each record's claim as a span from its first claim to its last change (to now while its
    lease is live), its steps when they were written, and every attempt in ``attempts`` at the time it ended
    (ran, replayed, refused, took over, released, held on an unknown outcome, an operator's act), with the
    time it waited for another caller as a whisker, linked to its line (``anchor``, by its place in
    ``attempts``). An operation whose record is gone (forgotten, swept) keeps its row of attempts."""
    rows: dict[str, Row] = {}
    tried = {a.key for a in attempts}
    for r in records:  # a claim under its attempts is drawn faint; without them (none kept), in full
        rows[r.key] = Row(r.operation, href(r.key), spans=[_claim(r, now, r.key in tried)], marks=_steps(r))
    for n, a in enumerate(attempts, 1):
        row = rows.get(a.key)
        if row is None:
            row = rows[a.key] = Row(a.operation, href(a.key))
        waited = (a.wait_ms or 0.0) / 1000
        title = f"#{n} attempt {a.attempt}: {a.kind.replace('_', ' ')}" + (f" ({a.detail})" if a.detail else "")
        if waited:
            title += f", after waiting {_seconds(waited)}"
        row.marks.append(Mark(a.at, a.kind, title, waited, anchor(n)))
    return list(rows.values())


def _shape(kind: str, x: float, y: float, colour: str) -> tuple[str, str]:
    """A mark's element, left open for its attributes and title, and its tag: a step is a diamond, an
    operator's act a square, an attempt a circle."""
    if kind in STEPS:
        return f'<path d="M{x:.1f},{y - 6} l6,6 l-6,6 l-6,-6 z" fill="{colour}" stroke="#fff"', "path"
    if kind in OPERATOR:
        return f'<rect x="{x - 5:.1f}" y="{y - 5}" width="10" height="10" fill="{colour}" stroke="#fff"', "rect"
    return f'<circle cx="{x:.1f}" cy="{y}" r="5.5" fill="{colour}" stroke="#fff" stroke-width="1"', "circle"


def _legend(used: set[str], top: float) -> tuple[list[str], float]:
    out, x, y = [], 8.0, top
    for table in (SPANS, MARKS):
        for kind, (colour, name) in table.items():
            if kind not in used:
                continue
            width = 30 + 7 * len(name)
            if x + width > WIDTH:
                x, y = 8.0, y + 20
            shape = (f'<rect x="{x}" y="{y - 10}" width="12" height="12" rx="2" fill="{colour}"/>' if table is SPANS
                     else _shape(kind, x + 6, y - 4, colour)[0] + "/>")
            out.append(f'{shape}<text x="{x + 16}" y="{y}" fill="#333">{escape(name)}</text>')
            x += width
    return out, y


@dataclass(frozen=True, slots=True)
class _Placed:
    mark: Mark
    x: float
    lane: int


def lay_out(marks: Sequence[Mark], x: Callable[[float], float]) -> tuple[list[_Placed], list[tuple[float, int]]]:
    """Each mark's place: at its time, in the first lane where it covers no other mark (nor another's whisker
    of waiting); ``MAX_LANES`` at most. What does not fit is counted where it is: (x, how many) marks left out,
    one count per place at least ``4 * SIZE`` from the next."""
    ends: list[float] = []  # where each lane is taken up to
    placed: list[_Placed] = []
    left_out: list[tuple[float, int]] = []
    for m in sorted(marks, key=lambda m: (m.at, m.kind)):
        mx = x(m.at)
        start = min(x(m.at - m.waited), mx) - SIZE / 2
        lane = next((i for i, end in enumerate(ends) if start >= end + 2), None)
        if lane is None and len(ends) < MAX_LANES:
            lane = len(ends)
            ends.append(0.0)
        if lane is None:
            if left_out and mx - left_out[-1][0] < 4 * SIZE:
                left_out[-1] = (left_out[-1][0], left_out[-1][1] + 1)
            else:
                left_out.append((mx, 1))
            continue
        ends[lane] = mx + SIZE / 2
        placed.append(_Placed(m, mx, lane))
    return placed, left_out


def svg(rows: Sequence[Row], *, title: str) -> str:
    """The picture of ``rows`` on one time axis, from the earliest start to the latest end."""
    times = [t for r in rows for t in (*(x for s in r.spans for x in (s.start, s.end)),
                                       *(x for m in r.marks for x in (m.at - m.waited, m.at)))]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    span = max(t1 - t0, 1e-3)
    plot = WIDTH - LABEL - 2 * PAD

    def x(t: float) -> float:
        return LABEL + PAD + (t - t0) / span * plot

    laid = [lay_out(r.marks, x) for r in rows]
    heights = [ROW + LANE * max((p.lane for p in placed), default=0) + (14 if out else 0) for placed, out in laid]
    bottom = TOP + sum(heights)
    legend, last = _legend({s.kind for r in rows for s in r.spans} | {m.kind for r in rows for m in r.marks},
                           bottom + 24)
    height = last + 12
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12" class="timeline">',
           f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fff"/>']
    step = _tick_step(span)
    k = 0
    while k * step <= span + 1e-9:
        tx = x(t0 + k * step)
        out.append(f'<line x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{bottom}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{tx:.1f}" y="{TOP - 10}" text-anchor="middle" fill="#555">+{_seconds(k * step)}</text>')
        k += 1
    y = float(TOP)
    for r, (placed, left_out), h in zip(rows, laid, heights, strict=True):
        if y > TOP:
            out.append(f'<line x1="0" y1="{y}" x2="{WIDTH}" y2="{y}" stroke="#f0f0f0"/>')
        label = r.label if len(r.label) <= 36 else r.label[:35] + "…"
        out.append(f'<a href="{escape(r.href)}"><text x="8" y="{y + ROW / 2 + 4}" fill="#1a237e">'
                   f"<title>{escape(r.label)}</title>{escape(label)}</text></a>")
        for s in r.spans:
            x1, x2 = x(s.start), max(x(s.end), x(s.start) + 3)
            faint = ' opacity="0.35"' if s.faint else ""
            out.append(f'<rect x="{x1:.1f}" y="{y + 7}" width="{x2 - x1:.1f}" height="{h - 14}" rx="3" '
                       f'fill="{SPANS.get(s.kind, ("#999", ""))[0]}"{faint} class="span {escape(s.kind)}">'
                       f"<title>{escape(s.title)}</title></rect>")
        for p in placed:
            m, colour = p.mark, MARKS.get(p.mark.kind, ("#999", ""))[0]
            my = y + ROW / 2 + LANE * p.lane
            if m.waited:
                out.append(f'<line x1="{x(m.at - m.waited):.1f}" y1="{my}" x2="{p.x:.1f}" y2="{my}" '
                           f'stroke="{colour}" stroke-width="2" class="wait"/>')
            shape, tag = _shape(m.kind, p.x, my, colour)
            element = f'{shape} class="mark {escape(m.kind)}"><title>{escape(m.title)}</title></{tag}>'
            out.append(f'<a href="#{m.anchor}">{element}</a>' if m.anchor else element)
        for mx, n in left_out:
            out.append(f'<text x="{mx:.1f}" y="{y + h - 4}" text-anchor="middle" fill="#333" class="more">'
                       f"+{n}</text>")
        y += h
    out.extend(legend)
    out.append("</svg>")
    return "\n".join(out)
