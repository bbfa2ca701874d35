"""The table, the targets of issue 7 with PASS/FAIL beside each ratio, and the JSON document."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._harness import Stat, ratio


@dataclass
class Target:
    id: str
    what: str
    value: float | None
    limit: float
    op: str  # "<=", ">=", "==", "<"
    unit: str = "×"
    why_na: str = ""
    per_rep: list[float] = field(default_factory=list)  # a ratio's value in each rep (its median is value)

    @property
    def result(self) -> str:
        if self.value is None or math.isnan(self.value):
            return "n/a"
        v, lim = self.value, self.limit
        ok = {"<=": v <= lim, ">=": v >= lim, "==": v == lim, "<": v < lim}[self.op]
        return "PASS" if ok else "FAIL"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "what": self.what, "value": None if self.value is None else round(self.value, 3),
                "limit": self.limit, "op": self.op, "unit": self.unit, "result": self.result,
                "note": self.why_na, "per_rep": [round(r, 3) for r in self.per_rep]}


def _fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def group_table(title: str, stats: dict[str, Stat], *, concurrent: bool = False, targets: dict[str, str] | None = None,
                notes: list[str] | None = None) -> str:
    """One group: µs/call, p50, client CPU, calls/s and the ratio to the variant's reference.

    ``targets`` maps a variant name to the target text shown beside it (e.g. "≤ 1.5× PASS").
    """
    targets = targets or {}
    width = max([len(s.name) for s in stats.values()] + [20])
    lines = [f"== {title}"]
    if concurrent:
        head = f"{'variant':<{width}}  {'calls/s':>9}  {'µs/call':>8}  {'CPU µs':>7}  {'× floor thr.':>12}  target"
    else:
        head = (f"{'variant':<{width}}  {'µs/call':>8}  {'p50 µs':>8}  {'CPU µs':>7}  {'× floor':>8}"
                f"  {'(p50)':>6}  target")
    lines += [head, "-" * len(head)]
    for s in stats.values():
        if s.unavailable or not s.reps:
            lines.append(f"{s.name:<{width}}  n/a ({s.unavailable or 'not run'})")
            continue
        r = ratio(stats, s.name, s.ref) if s.ref else None
        tgt = targets.get(s.name, "")
        if concurrent:
            thr = None if r is None else 1 / r
            lines.append(f"{s.name:<{width}}  {_fmt(s.median('calls_per_s'), 0):>9}  {_fmt(s.median('us_per_call')):>8}"
                         f"  {_fmt(s.median('cpu_per_call')):>7}  {_fmt(thr, 2):>12}  {tgt}")
        else:
            r50 = ratio(stats, s.name, s.ref, "p50") if s.ref else None
            lines.append(f"{s.name:<{width}}  {_fmt(s.median('us_per_call')):>8}  {_fmt(s.median('p50')):>8}"
                         f"  {_fmt(s.median('cpu_per_call')):>7}  {_fmt(r, 2):>8}  {_fmt(r50, 2):>6}  {tgt}")
    for n in notes or []:
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def group_json(stats: dict[str, Stat], notes: list[str], **extra: Any) -> dict[str, Any]:
    variants = []
    for s in stats.values():
        d = s.as_dict()
        if s.ref and not s.unavailable and s.reps:
            d["ref"] = s.ref
            d["ratio"] = None if (r := ratio(stats, s.name, s.ref)) is None else round(r, 3)
            d["cpu_ratio"] = None if (r := ratio(stats, s.name, s.ref, "cpu_per_call")) is None else round(r, 3)
            if not math.isnan(s.median("p50")):
                d["p50_ratio"] = None if (r := ratio(stats, s.name, s.ref, "p50")) is None else round(r, 3)
        variants.append(d)
    return {"variants": variants, "notes": notes, **extra}


def us(stats: dict[str, Stat] | None, name: str) -> float | None:
    if stats is None:
        return None
    s = stats.get(name)
    if s is None or s.unavailable or not s.reps:
        return None
    return s.median("us_per_call")


def cpu_gap(stats: dict[str, Stat] | None, name: str, ref: str) -> float | None:
    """Median over reps of (client CPU of ``name`` - client CPU of ``ref``) per call, µs."""
    import statistics

    if stats is None:
        return None
    a, b = stats.get(name), stats.get(ref)
    if a is None or b is None or a.unavailable or b.unavailable or not a.reps or len(a.reps) != len(b.reps):
        return None
    return statistics.median(x.cpu_per_call - y.cpu_per_call for x, y in zip(a.reps, b.reps, strict=True))


def targets_table(targets: list[Target]) -> str:
    lines = ["== Targets (issue 7)"]
    width = max(len(t.what) for t in targets)
    for t in targets:
        val = "—" if t.value is None else (f"{t.value:.2f}{t.unit}" if t.unit == "×" else f"{t.value:.2f} {t.unit}")
        lim = f"{t.op} {t.limit:g}{t.unit if t.unit == '×' else ' ' + t.unit}"
        extra = f"  ({t.why_na})" if t.why_na else ""
        if t.per_rep:
            extra += f"  reps {min(t.per_rep):.2f}–{max(t.per_rep):.2f}"
        lines.append(f"{t.result:<5} {t.what:<{width}}  {val:>12}  {lim}{extra}")
    return "\n".join(lines)
