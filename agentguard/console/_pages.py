"""The console's pages, as HTML strings: plain forms and links, a stylesheet, no script.

Every value that comes from the store or the request is escaped here (``_e``). A page shows names, states,
times and keys; values (a record's arguments, its result, a step's result) appear only on a record's own page,
and only to the token's holder. What a page says is in its text: a title a browser shows on hover repeats
it, never holds it alone. A long list comes a page at a time, with how long it is (``pager``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

from .._keys import sub_key
from ..stores import Attempt
from ..stores._console import STATES, HeldRow, Page, RecordRow, TaskRow
from ._timeline import anchor

STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:600}
header .who{margin-left:auto;font-size:13px;opacity:.85}
main{padding:16px 20px;max-width:2200px}
table{border-collapse:collapse;width:100%;background:#fff;margin:8px 0 20px}
th,td{border-bottom:1px solid #e0e0e0;padding:5px 8px;text-align:left;font-size:14px;vertical-align:top}
th{background:#eceff1;font-weight:600}
code,.key{font-family:ui-monospace,monospace;font-size:12px}
.key{word-break:break-all}
.note{padding:8px 12px;border-radius:4px;margin:8px 0;background:#e8f5e9;border:1px solid #a5d6a7}
.error{padding:8px 12px;border-radius:4px;margin:8px 0;background:#ffebee;border:1px solid #ef9a9a}
.state{padding:1px 6px;border-radius:8px;font-size:12px;color:#fff;white-space:nowrap}
.state.succeeded{background:#2e7d32}.state.failed{background:#c62828}.state.running{background:#1565c0}
.state.released{background:#8d8d8d}.state.held{background:#ef6c00}
form.filters{display:flex;gap:10px;align-items:end;flex-wrap:wrap}
form.filters label{display:flex;flex-direction:column;font-size:12px}
fieldset{background:#fff;border:1px solid #cfd8dc;margin:10px 0;max-width:760px}
textarea{width:100%;font-family:ui-monospace,monospace}
pre{background:#fff;border:1px solid #e0e0e0;padding:8px;overflow:auto;max-height:320px}
.svgbox{overflow-x:auto;background:#fff;border:1px solid #e0e0e0}
nav.pager{margin:6px 0;font-size:14px;display:flex;gap:14px;align-items:baseline;flex-wrap:wrap}
nav.pager .count{font-weight:600}
table.attempts td{font-size:13px}
tr:target{background:#fff59d}
.pair{display:grid;grid-template-columns:minmax(0,1fr);gap:0 16px}
@media (min-width:1700px){.pair{grid-template-columns:962px minmax(0,1fr)}}
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _q(path: str, **params: str) -> str:
    return f"{path}?{urlencode(params)}"


def task_href(scope: str, task_id: str, page: int = 1) -> str:
    return _q("/task", scope=scope, id=task_id, **({"page": str(page)} if page > 1 else {}))


def record_href(scope: str, key: str) -> str:
    return _q("/record", scope=scope, key=key)


def _ago(seconds: float) -> str:
    s = max(seconds, 0.0)
    if s < 120:
        return f"{s:.0f}s ago"
    if s < 7200:
        return f"{s / 60:.0f}m ago"
    if s < 172800:
        return f"{s / 3600:.0f}h ago"
    return f"{s / 86400:.0f}d ago"


def _when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.1f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def _state(r: RecordRow, now: float) -> str:
    kind = "held" if r.held else r.state
    live = f" (lease {r.lease_until - now:.0f}s left)" if r.live and r.lease_until else ""
    return f'<span class="state {_e(kind)}">{_e(kind)}</span>{_e(live)}'


def _n(n: int) -> str:
    return f"{n:,}"


def pager(path: str, params: dict[str, str], page: Page[Any], per: int, what: str) -> str:
    """Where this page is in the list (``tasks 101–200 of 25,000``) and links to the first, previous, next and
    last pages, with the page's other parameters."""
    last = max((page.total + per - 1) // per, 1)
    number = page.offset // per + 1
    if page.rows:
        where = f"{what} {_n(page.offset + 1)}–{_n(page.offset + len(page.rows))} of {_n(page.total)}"
    else:
        where = f"no {what} on page {_n(number)}: there are {_n(page.total)}"
    links = []
    for label, to, shown in (("« first", 1, number > 1), ("‹ previous", min(number - 1, last), number > 1),
                             ("next ›", number + 1, number < last), ("last »", last, number < last)):
        if shown:
            target = {**params, **({"page": str(to)} if to > 1 else {})}
            links.append(f'<a href="{_e(_q(path, **target))}" rel="{"prev" if to < number else "next"}">'
                         f"{_e(label)}</a>")
    page_of = f" · page {_n(number)} of {_n(last)}" if last > 1 else ""
    return f'<nav class="pager"><span class="count">{_e(where)}</span>{_e(page_of)}{"".join(links)}</nav>'


@dataclass(frozen=True, slots=True)
class Frame:
    """What every page knows: whether the viewer holds the token, and what to say at the top."""

    signed_in: bool
    csrf: str
    note: str | None = None
    error: str | None = None


def page(title: str, body: str, frame: Frame) -> str:
    who = ("signed in with the token: actions enabled" if frame.signed_in
           else "read-only: open the URL with the token printed at start to act")
    notes = "".join(
        f'<div class="{cls}" role="{role}">{_e(text)}</div>'
        for cls, role, text in (("note", "status", frame.note), ("error", "alert", frame.error)) if text
    )
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)} · agentguard</title>'
            f"<style>{STYLE}</style></head><body><header><a href=\"/\">agentguard console</a>"
            f'<span class="who">{_e(who)}</span></header><main><h1>{_e(title)}</h1>{notes}{body}</main></body></html>')


# What is held, when it is not a step (``Guard.unknown``'s ``held``).
_HELD_BODY = {"body": "the body (its worker went away inside it)", "not_stored": "the body (its result could not "
              "be stored)"}


def _held_row(h: HeldRow) -> str:
    what = f"<code>{_e(h.step)}</code>" if h.step is not None else _e(_HELD_BODY.get(h.held, "the body"))
    return (f"<tr><td>{_e(h.scope)}</td><td><a href=\"{_e(task_href(h.scope, h.task_id))}\">{_e(h.task_id)}</a></td>"
            f"<td>{_e(h.operation)}</td><td>{what}</td>"
            f"<td class=\"key\">{_e(h.key if h.step is None else sub_key(h.key, h.step))}</td><td>{h.attempts}</td>"
            f"<td>{_e(_ago(h.age))}</td><td><a href=\"{_e(record_href(h.scope, h.key))}\">settle</a></td></tr>")


def _held_queue(held: Page[HeldRow], scope: str | None) -> str:
    if not held.rows:
        return "<p>No operation is held on an unknown outcome.</p>"
    more = ""
    if held.total > len(held.rows):
        every = _q("/", state="held", **({"scope": scope} if scope else {}))
        more = (f'<p>The {len(held.rows)} latest of {_n(held.total)} are shown; <a href="{_e(every)}">the tasks with '
                "a held outcome</a> lead to all of them.</p>")
    return ("<table class=\"held\"><tr><th>scope</th><th>task</th><th>operation</th><th>step</th>"
            "<th>sub-key (the provider's idempotency key)</th><th>attempts</th><th>claimed</th><th></th></tr>"
            + "".join(_held_row(h) for h in held.rows) + "</table>" + more)


def _search_form(filters: dict[str, str]) -> str:
    options = "".join(f'<option value="{s}"{" selected" if filters.get("state") == s else ""}>{s or "any"}</option>'
                      for s in ("", *STATES))

    def field(name: str, label: str, size: int) -> str:
        return (f'<label>{_e(label)}<input name="{name}" size="{size}" value="{_e(filters.get(name, ""))}">'
                "</label>")

    return ('<form class="filters" method="get" action="/" role="search">'
            + field("task", "task id (or its start)", 24) + field("key", "key (or its start)", 28)
            + field("operation", "operation (starts with)", 20) + field("scope", "scope", 12)
            + f'<label>state<select name="state">{options}</select></label>'
            '<button type="submit">search</button></form>')


def _found(found: Sequence[tuple[str, str, str, str]], key: str, shown: int) -> str:
    if not found:
        return f"<p>No record's key starts with <code>{_e(key)}</code>.</p>"
    more = (f"<p>The first {shown} are shown: give more of the key.</p>" if len(found) > shown else "")
    rows = "".join(
        f"<tr><td class=\"key\"><a href=\"{_e(record_href(s, k))}\">{_e(k)}</a></td><td>{_e(s)}</td>"
        f"<td><a href=\"{_e(task_href(s, t))}\">{_e(t)}</a></td><td>{_e(o)}</td></tr>"
        for k, s, t, o in found[:shown]
    )
    return (f"<p>Several records' keys start with <code>{_e(key)}</code>:</p>"
            f"<table class=\"found\"><tr><th>key</th><th>scope</th><th>task</th><th>operation</th></tr>{rows}</table>"
            + more)


def tasks_page(frame: Frame, tasks: Page[TaskRow], held: Page[HeldRow] | None, filters: dict[str, str], per: int,
               *, found: Sequence[tuple[str, str, str, str]] | None = None, shown: int = 100) -> str:
    """The held outcomes (on the first page), the search form, and a page of the tasks (or, for a key's start
    that several records' keys have, those records)."""
    body = ""
    if held is not None:
        body += f"<h2>{_e(f'Held outcomes ({_n(held.total)})')}</h2>{_held_queue(held, filters.get('scope'))}"
    body += f"<h2>Tasks</h2>{_search_form(filters)}"
    if found is not None:
        return page("Tasks", body + _found(found, filters.get("key", ""), shown), frame)
    now = tasks.now
    rows = "".join(
        f"<tr><td>{_e(t.scope)}</td><td><a href=\"{_e(task_href(t.scope, t.task_id))}\">{_e(t.task_id)}</a></td>"
        f"<td>{_n(t.operations)}</td><td>"
        + " ".join(f'<span class="state {s}">{_n(n)} {s}</span>' for s, n in t.states.items() if n)
        + f"</td><td>{_e(_ago(now - t.latest))}</td><td>{_e(_ago(now - t.first))}</td>"
        f"<td>{_e(_ago(now - t.last))}</td></tr>"
        for t in tasks.rows
    )
    nav = pager("/", filters, tasks, per, "tasks")
    if tasks.rows:
        body += (f"{nav}<table class=\"tasks\"><tr><th>scope</th><th>task</th><th>operations</th><th>states</th>"
                 f"<th>latest claim</th><th>first claim</th><th>last change</th></tr>{rows}</table>{nav}")
    elif tasks.total:
        body += nav
    else:
        body += "<p>No tasks match.</p>"
    return page("Tasks", body, frame)


def attempts_table(attempts: Sequence[Attempt], href: dict[str, str] | None = None) -> str:
    """The ledger's entries as a table, numbered as the timeline's marks are (each line is a mark's target):
    when it ended, which operation, which attempt of it, what it came to, who made it, how long the guard
    took and how long it waited, and the key the provider saw (the record's: each step's sub-key is derived
    from it)."""
    if not attempts:
        return "<p>No attempt of these operations is in the ledger.</p>"
    rows = []
    for n, a in enumerate(attempts, 1):
        op = _e(a.operation)
        if href is not None and a.key in href:
            op = f'<a href="{_e(href[a.key])}">{op}</a>'
        what = f'<span class="kind">{_e(a.kind.replace("_", " "))}</span>' + (f": {_e(a.detail)}" if a.detail else "")
        who = _e(a.process) + (f"<br>call <code>{_e(a.call_id)}</code>" if a.call_id else "")
        took = " · ".join(x for x in (_ms(a.guard_ms) and f"guard {_ms(a.guard_ms)}",
                                      _ms(a.wait_ms) and f"waited {_ms(a.wait_ms)}") if x)
        rows.append(f'<tr id="{anchor(n)}"><td>{n}</td><td>{_e(_when(a.at))}</td><td>{op}</td><td>{a.attempt}</td>'
                    f"<td>{what}</td><td>{who}</td><td>{_e(took)}</td><td class=\"key\">{_e(a.key)}</td></tr>")
    return ("<table class=\"attempts\"><tr><th>#</th><th>ended (UTC)</th><th>operation</th><th>attempt</th>"
            "<th>what happened</th><th>who</th><th>how long</th><th>downstream key</th></tr>"
            + "".join(rows) + "</table>")


def task_page(frame: Frame, scope: str, task_id: str, records: Page[RecordRow], per: int, picture: str,
              attempts: Sequence[Attempt], attempts_note: str) -> str:
    now = records.now
    rows = "".join(
        f"<tr><td><a href=\"{_e(record_href(r.scope, r.key))}\">{_e(r.operation)}</a></td><td>{_state(r, now)}</td>"
        f"<td>{r.attempts}</td><td>{_e(', '.join(f'{s.name} ({s.state})' for s in r.steps))}</td>"
        f"<td>{_e(_ago(now - r.created))}</td><td>{(r.updated - r.created):.3f} s</td>"
        f"<td class=\"key\">{_e(r.key)}</td></tr>"
        for r in records.rows
    )
    nav = pager("/task", {"scope": scope, "id": task_id}, records, per, "operations")
    table = ("<table class=\"records\"><tr><th>operation</th><th>state</th><th>attempts</th>"
             f"<th>steps</th><th>claimed</th><th>claimed to last change</th><th>key</th></tr>{rows}</table>"
             if records.rows else "")
    hrefs = {r.key: record_href(r.scope, r.key) for r in records.rows}
    body = (f"<p>scope <code>{_e(scope)}</code> · {_n(records.total)} operation(s)</p>{nav}"
            "<div class=\"pair\"><section><h2>Timeline</h2>"
            f"<div class=\"svgbox\">{picture}</div></section>"
            f"<section><h2>Attempts ({_n(len(attempts))})</h2><p>{_e(attempts_note)}</p>"
            f"{attempts_table(attempts, hrefs)}</section></div>"
            f"<h2>Operations</h2>{table}{nav}")
    return page(f"Task {task_id}", body, frame)


def _value(text: str | None) -> str:
    if text is None:
        return "<p><em>none stored</em></p>"
    try:
        shown = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        shown = text
    return f"<pre>{_e(shown)}</pre>"


def _settle_forms(frame: Frame, r: RecordRow, draft: str) -> str:
    if not (r.held or (r.state in ("running", "released") and not r.live)):
        return ""
    if not frame.signed_in:
        return "<p>Settling needs the token printed when the console started.</p>"

    def form(how: str, legend: str, inner: str, button: str) -> str:
        return (f'<form method="post" action="/settle" class="settle-{how}"><fieldset><legend>{_e(legend)}</legend>'
                f'<input type="hidden" name="csrf" value="{_e(frame.csrf)}">'
                f'<input type="hidden" name="scope" value="{_e(r.scope)}">'
                f'<input type="hidden" name="key" value="{_e(r.key)}">'
                f'<input type="hidden" name="revision" value="{_e(r.revision)}">'
                f'<input type="hidden" name="how" value="{how}">{inner}'
                f'<button type="submit">{_e(button)}</button></fieldset></form>')

    out = []
    step = r.step
    if r.held and step is not None:
        out.append(form("result", f"Record the real outcome of step {step!r}",
                        '<label for="result">the step\'s result, as JSON (e.g. the provider\'s charge)</label>'
                        f'<textarea id="result" name="result" rows="5" required>{_e(draft)}</textarea>',
                        "record result"))
        out.append(form("retry", f"Run step {step!r} again on the next attempt (same sub-key)", "", "retry step"))
    elif r.held:  # held on its body: its worker went away inside it, or its result could not be stored
        out.append(form("result", "Record the real outcome of the operation (every later call receives it)",
                        '<label for="result">its result, as JSON (e.g. the provider\'s charge)</label>'
                        f'<textarea id="result" name="result" rows="5" required>{_e(draft)}</textarea>',
                        "record result"))
        out.append(form("retry", "Run it again on the next call (same key)", "", "retry operation"))
    out.append(form("abandon", "Give the operation up (every later call errors)", "", "abandon operation"))
    return ("<h2>Settle</h2><p>A decision is made on the revision shown above: if the record changes before it "
            "arrives, it is refused and the page says what changed; the same decision sent twice is made once.</p>"
            + "".join(out))


def record_page(frame: Frame, now: float, r: RecordRow, attempts: Sequence[Attempt], attempts_note: str, *,
                draft: str = "") -> str:
    facts = (("scope", r.scope), ("task", r.task_id), ("operation", r.operation), ("tool", r.tool),
             ("attempts", str(r.attempts)), ("claimed", _ago(now - r.created)),
             ("last change", f"{_ago(now - r.updated)} ({_when(r.updated)} UTC)"),
             ("key (also the downstream key)", r.key), ("revision", r.revision))
    rows = "".join(f"<tr><th>{_e(k)}</th><td class=\"{'key' if k in ('revision',) else ''}\">{_e(v)}</td></tr>"
                   for k, v in facts)
    rows += f"<tr><th>state</th><td>{_state(r, now)}</td></tr>"
    step_head = "<th>result</th>" if frame.signed_in else ""
    steps = "".join(
        f"<tr><td>{s.seq}</td><td><code>{_e(s.name)}</code></td>"
        f"<td>{'unknown outcome' if r.held and s.state == 'started' else _e(s.state)}</td>"
        f"<td class=\"key\">{_e(sub_key(r.key, s.name))}</td><td>{_e(_ago(now - s.at))}</td>"
        + (f"<td>{_value(s.result)}</td>" if frame.signed_in else "") + "</tr>"
        for s in r.steps
    )
    body = (f'<p><a href="{_e(task_href(r.scope, r.task_id))}">back to the task</a></p>'
            f"<table class=\"record\">{rows}</table>")
    if r.steps:
        body += ("<h2>Steps</h2><table class=\"steps\"><tr><th>#</th><th>step</th><th>state</th><th>sub-key</th>"
                 f"<th>written</th>{step_head}</tr>{steps}</table>")
    if frame.signed_in:
        body += (f"<h2>Values</h2><h3>result</h3>{_value(r.result)}<h3>arguments (kept for resumable tools)</h3>"
                 f"{_value(r.arguments)}<h3>audit</h3>{_value(r.audit)}")
    else:
        body += "<p>Values (arguments, results) are shown to the token's holder only.</p>"
    body += _settle_forms(frame, r, draft)
    body += (f"<h2>Attempts ({_n(len(attempts))})</h2>"
             + (f"<p>{_e(attempts_note)}</p>" if attempts_note else "") + attempts_table(attempts))
    return page(f"Record {r.operation}", body, frame)


def message_page(frame: Frame, title: str) -> str:
    return page(title, '<p><a href="/">back to the tasks</a></p>', frame)
