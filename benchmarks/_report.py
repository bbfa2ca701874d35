"""The report: one table per group, the durability counts, the peers, and the targets with PASS/FAIL."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from ._harness import Stat, ratio, ratios, us


@dataclass
class Target:
    id: str
    what: str
    value: float | None
    limit: float
    op: str  # "<=", ">=", "==", "<"
    unit: str = "×"
    why_na: str = ""
    per_rep: list[float] = field(default_factory=list)  # a ratio's value in each rep (value is their median)
    where: tuple[str, str] = ("", "")  # (group, variant) a target on one variant is shown beside
    name: str = ""  # the variant (where[1] is the other variant, when the ratio is taken to another one)

    @property
    def result(self) -> str:
        if self.value is None or math.isnan(self.value):
            return "n/a"
        v, lim = self.value, self.limit
        return "PASS" if {"<=": v <= lim, ">=": v >= lim, "==": v == lim, "<": v < lim}[self.op] else "FAIL"

    @property
    def limit_text(self) -> str:
        return f"{self.op} {self.limit:g}{self.unit if self.unit == '×' else ' ' + self.unit}"

    @property
    def beside(self) -> str:
        """What the table shows beside the variant (or, for a ratio to another variant, beside that one)."""
        return f"{'agentguard ÷ this ' if self.where[1] != self.name else ''}{self.limit_text} {self.result}"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "what": self.what, "value": None if self.value is None else round(self.value, 3),
                "limit": self.limit, "op": self.op, "unit": self.unit, "result": self.result,
                "note": self.why_na, "per_rep": [round(r, 3) for r in self.per_rep]}


def of_stats(id: str, what: str, group: str, stats: dict[str, Stat], name: str, op: str, limit: float, unit: str,
             against: str = "") -> Target:
    """A target on one variant: its µs per call, or its ratio to ``against`` or else to its floor, taken in each
    rep (op ">=": the throughput ratio)."""
    s, ref = stats.get(name), stats.get(against)
    why = next((x.unavailable or "not measured" for x in (s, ref) if x is not None and not x.ok), "")
    why = why if s is not None else "not measured"
    if unit != "×":
        return Target(id, what, us(stats, name), limit, op, unit, why, where=(group, name), name=name)
    per_rep = ratios(stats, name, against or s.ref) if s is not None else []
    per_rep = [1 / r for r in per_rep] if op == ">=" else per_rep
    return Target(id, what, statistics.median(per_rep) if per_rep else None, limit, op, unit, why, per_rep,
                  (group, against or name), name)


def fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"


def group_json(stats: dict[str, Stat], notes: list[str], **extra: Any) -> dict[str, Any]:
    """Each variant's medians over reps, and its ratios to its floor (the median of the per-rep ratios)."""
    rows: list[dict[str, Any]] = []
    for s in stats.values():
        row: dict[str, Any] = {"name": s.name, "unavailable": s.unavailable or "not run"}
        if s.ok:
            row = {"name": s.name, "reps": len(s.reps), "ref": s.ref, **{k: round(s.median(a), 2) for k, a in _COLS}}
            for key, attr in (("ratio", "us_per_call"), ("p50_ratio", "p50"), ("cpu_ratio", "cpu_per_call")):
                r = ratio(stats, s.name, s.ref, attr) if s.ref else None
                row[key] = None if r is None or math.isnan(r) else round(r, 3)
        rows.append(row)
    return {"variants": rows, "notes": notes, **extra}


_COLS = (("us_per_call", "us_per_call"), ("p50_us", "p50"), ("cpu_us_per_call", "cpu_per_call"))


def group_table(title: str, group: dict[str, Any], beside: dict[str, str]) -> str:
    """µs/call, p50, CPU, the ratio to the variant's floor and that of the p50s; ``beside``: a target's text."""
    width = max([len(r["name"]) for r in group["variants"]] + [20])
    head = f"{'variant':<{width}}  " + "  ".join(f"{c:>7}" for c in ("µs/call", "p50 µs", "CPU µs", "× floor",
                                                                      "(p50)")) + "  target"
    lines = [f"== {title}", head, "-" * len(head)]
    for r in group["variants"]:
        cells = [fmt(r.get(k)) for k, _ in _COLS] + [fmt(r.get(k), 2) for k in ("ratio", "p50_ratio")]
        row = f"n/a ({r['unavailable']})" if "unavailable" in r else "  ".join(f"{c:>7}" for c in cells)
        lines.append(f"{r['name']:<{width}}  {row}  {beside.get(r['name'], '')}".rstrip())
    return "\n".join(lines + [f"  note: {n}" for n in group["notes"]])


def cpu_gap(stats: dict[str, Stat], name: str, ref: str) -> float | None:
    """Median over reps of (client CPU of ``name`` - client CPU of ``ref``) per call, µs."""
    a, b = stats.get(name), stats.get(ref)
    if a is None or b is None or not a.ok or not b.ok:
        return None
    return statistics.median(x.cpu_per_call - y.cpu_per_call for x, y in zip(a.reps, b.reps, strict=True))


def counts_table(counts: dict[str, Any]) -> str:
    s, w = counts["settings"], max(28, *(len(k) for k in counts))
    cols = ("commits", "transactions", "rows_written", "wal_flushes", "wal_bytes")
    lines = [f"== Postgres durability cost per call (synchronous_commit=on, fsync={s.get('fsync')}, {counts['calls']}"
             " calls; counted from pg_stat_database, pg_stat_wal and xids)",
             f"{'variant':<{w}}" + "".join(f"  {c.replace('_', ' '):>12}" for c in cols)]
    for name, row in counts.items():
        if isinstance(row, dict) and "commits" in row:
            lines.append(f"{name:<{w}}" + "".join(f"  {fmt(row[c], 0 if c == 'wal_bytes' else 2):>12}" for c in cols)
                         + ("  (noisy)" if row["noisy"] else ""))
    lines.append("  commits = transactions that were assigned an xid (each a commit record to flush); transactions ="
                 " round trips (pg_stat_database.xact_commit)" + ("" if s.get("fsync") == "on" else
                                                                   "; fsync is off here: WAL flushes not counted"))
    return "\n".join(lines)


def peers_table(peers: dict[str, Any]) -> str:
    lines = ["== Peers: DBOS, each in a process of its own, with agentguard first calls beside it"]
    for key, p in peers.items():
        lines.append(f"{key}: n/a ({p['unavailable']})" if "unavailable" in p else f"{key}: DBOS step"
                     f" {fmt(p['dbos_step_us'])} µs, agentguard first call {fmt(p['agentguard_first_call_us'])} µs →"
                     f" {p['ratio']:.2f}×")
    return "\n".join(lines)


def targets_table(targets: list[Target]) -> str:
    if not targets:  # (a run that measured nothing with a target: a peer not installed, say)
        return "== Targets\n(none measured in this run)"
    width = max(len(t.what) for t in targets)
    lines = ["== Targets"]
    for t in targets:
        val = "—" if t.value is None else (f"{t.value:.2f}×" if t.unit == "×" else f"{t.value:.2f} {t.unit}")
        extra = (f"  ({t.why_na})" if t.why_na else "") + (
            f"  reps {min(t.per_rep):.2f}–{max(t.per_rep):.2f}" if t.per_rep else "")
        lines.append(f"{t.result:<5} {t.what:<{width}}  {val:>12}  {t.limit_text}{extra}")
    return "\n".join(lines)
