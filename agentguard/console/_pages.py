"""The console's pages, as HTML strings: plain forms and links, a stylesheet, no script.

Every value that comes from the store or the request is escaped here (``_e``). A page shows names, states,
times and keys; values (a record's arguments, its result, a step's result) appear only on a record's own page,
and only to the token's holder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from urllib.parse import urlencode

from .._keys import sub_key
from ..stores._views import STATES, RecordRow, TaskRow

STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:600}
header .who{margin-left:auto;font-size:13px;opacity:.85}
main{padding:16px 20px;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff;margin:8px 0 20px}
th,td{border-bottom:1px solid #e0e0e0;padding:5px 8px;text-align:left;font-size:14px;vertical-align:top}
th{background:#eceff1;font-weight:600}
code,.key{font-family:ui-monospace,monospace;font-size:12px}
.note{padding:8px 12px;border-radius:4px;margin:8px 0;background:#e8f5e9;border:1px solid #a5d6a7}
.error{padding:8px 12px;border-radius:4px;margin:8px 0;background:#ffebee;border:1px solid #ef9a9a}
.state{padding:1px 6px;border-radius:8px;font-size:12px;color:#fff}
.state.succeeded{background:#2e7d32}.state.failed{background:#c62828}.state.running{background:#1565c0}
.state.released{background:#8d8d8d}.state.held{background:#ef6c00}
form.filters{display:flex;gap:10px;align-items:end;flex-wrap:wrap}
form.filters label{display:flex;flex-direction:column;font-size:12px}
fieldset{background:#fff;border:1px solid #cfd8dc;margin:10px 0;max-width:760px}
textarea{width:100%;font-family:ui-monospace,monospace}
pre{background:#fff;border:1px solid #e0e0e0;padding:8px;overflow:auto;max-height:320px}
.svgbox{overflow-x:auto;background:#fff;border:1px solid #e0e0e0}
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _q(path: str, **params: str) -> str:
    return f"{path}?{urlencode(params)}"


def task_href(scope: str, task_id: str) -> str:
    return _q("/task", scope=scope, id=task_id)


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


def _state(r: RecordRow, now: float) -> str:
    kind = "held" if r.held else r.state
    live = f" (lease {r.lease_until - now:.0f}s left)" if r.live and r.lease_until else ""
    return f'<span class="state {_e(kind)}">{_e(kind)}</span>{_e(live)}'


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


def _held_row(h: dict[str, object]) -> str:
    scope, key, task_id = (str(h[k]) for k in ("scope", "key", "task_id"))
    step = None if h["step"] is None else str(h["step"])
    what = f"<code>{_e(step)}</code>" if step is not None else _e(_HELD_BODY.get(str(h.get("held")), "the body"))
    return (f"<tr><td>{_e(scope)}</td><td><a href=\"{_e(task_href(scope, task_id))}\">{_e(task_id)}</a></td>"
            f"<td>{_e(h['operation'])}</td><td>{what}</td>"
            f"<td class=\"key\">{_e(key if step is None else sub_key(key, step))}</td><td>{_e(h['attempts'])}</td>"
            f"<td>{_e(_ago(float(str(h['age']))))}</td>"
            f"<td><a href=\"{_e(record_href(scope, key))}\" title=\"{_e(key)}\">settle</a></td></tr>")


def _held_queue(held: Sequence[dict[str, object]]) -> str:
    if not held:
        return "<p>No operation is held on an unknown outcome.</p>"
    return ("<table class=\"held\"><tr><th>scope</th><th>task</th><th>operation</th><th>step</th>"
            "<th>sub-key (the provider's idempotency key)</th><th>attempts</th><th>since</th><th></th></tr>"
            + "".join(_held_row(h) for h in held) + "</table>")


def tasks_page(frame: Frame, now: float, tasks: Sequence[TaskRow], held: Sequence[dict[str, object]],
               filters: dict[str, str]) -> str:
    options = "".join(f'<option value="{s}"{" selected" if filters.get("state") == s else ""}>{s}</option>'
                      for s in ("", *STATES))
    form = (
        '<form class="filters" method="get" action="/">'
        f'<label>scope<input name="scope" value="{_e(filters.get("scope", ""))}"></label>'
        f'<label>state<select name="state">{options}</select></label>'
        f'<label>operation (starts with)<input name="operation" value="{_e(filters.get("operation", ""))}"></label>'
        "<button type=\"submit\">filter</button></form>"
    )
    rows = "".join(
        f"<tr><td>{_e(t.scope)}</td><td><a href=\"{_e(task_href(t.scope, t.task_id))}\">{_e(t.task_id)}</a></td>"
        f"<td>{t.operations}</td><td>"
        + " ".join(f'<span class="state {s}">{n} {s}</span>' for s, n in t.states.items() if n)
        + f"</td><td>{_e(_ago(now - t.first))}</td><td>{_e(_ago(now - t.last))}</td></tr>"
        for t in tasks
    )
    table = ("<table class=\"tasks\"><tr><th>scope</th><th>task</th><th>operations</th><th>states</th>"
             f"<th>started</th><th>last change</th></tr>{rows}</table>" if tasks else "<p>No tasks match.</p>")
    body = (f"<h2>Held outcomes ({len(held)})</h2>{_held_queue(held)}"
            f"<h2>Tasks</h2>{form}{table}")
    return page("Tasks", body, frame)


def task_page(frame: Frame, scope: str, task_id: str, now: float, records: Sequence[RecordRow], picture: str,
              attempts: int) -> str:
    rows = "".join(
        f"<tr><td><a href=\"{_e(record_href(r.scope, r.key))}\">{_e(r.operation)}</a></td><td>{_state(r, now)}</td>"
        f"<td>{r.attempts}</td><td>{_e(', '.join(f'{s.name} ({s.state})' for s in r.steps))}</td>"
        f"<td>{_e(_ago(now - r.created))}</td><td>{(r.updated - r.created):.3f} s</td>"
        f"<td class=\"key\" title=\"{_e(r.key)}\">{_e(r.key[:15])}…</td></tr>"
        for r in records
    )
    body = (f"<p>scope <code>{_e(scope)}</code> · {len(records)} operation(s) · {attempts} attempt(s) in the "
            f"ledger</p><h2>Timeline</h2><div class=\"svgbox\">{picture}</div>"
            "<h2>Operations</h2><table class=\"records\"><tr><th>operation</th><th>state</th><th>attempts</th>"
            f"<th>steps</th><th>claimed</th><th>claimed to last change</th><th>key</th></tr>{rows}</table>")
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
                f'<input type="hidden" name="how" value="{how}">{inner}'
                f'<button type="submit">{_e(button)}</button></fieldset></form>')

    out = []
    step = next((s.name for s in r.steps if s.state == "started"), None)
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
    return "<h2>Settle</h2>" + "".join(out)


def record_page(frame: Frame, now: float, r: RecordRow, *, draft: str = "") -> str:
    facts = (("scope", r.scope), ("task", r.task_id), ("operation", r.operation), ("tool", r.tool),
             ("attempts", str(r.attempts)), ("claimed", _ago(now - r.created)),
             ("last change", _ago(now - r.updated)), ("key (also the downstream key)", r.key))
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
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
    return page(f"Record {r.operation}", body, frame)


def message_page(frame: Frame, title: str) -> str:
    return page(title, '<p><a href="/">back to the tasks</a></p>', frame)
