"""What one guarded call came to, told once to the ledger (``_ledger``) and to OpenTelemetry (``_otel``).

The engine's drivers fill a ``Note`` as the call goes (replayed, claimed, the body's time, what the recording
made of it); ``Observer.end`` turns it, or the exception the call raised, into one outcome: the ledger entry's
``kind`` and the span's ``agentguard.outcome``. With no ledger and no telemetry the drivers skip all of it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from . import _otel
from ._calls import Call
from ._errors import (
    InProgressError,
    KeyReuseError,
    LeaseLostError,
    MissingTaskError,
    OutcomeUnknownError,
    ResultNotStoredError,
    StoreError,
)
from ._ledger import Ledger
from .stores._attempts import CALL_ID_MAX, LEASE_LOST, NOT_STORED, RAN, REFUSED, REPLAYED, TOOK_OVER, UNKNOWN

# Host ids of an invocation, in the order one is picked for ``call_id`` (the audit the adapters store). The last,
# an MCP request's JSON-RPC id, names the request, not the model's tool call: never a ``gen_ai.tool.call.id``.
_CALL_IDS = ("tool_call_id", "claudecode/toolUseId", "callId", "itemId", "request_id")
_TOOL_CALL_IDS = _CALL_IDS[:-1]


class Note:
    """One call as the drivers saw it."""

    __slots__ = ("attempt", "body", "call", "detail", "kind", "span", "started", "token", "took")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.started = time.perf_counter()
        self.body = 0.0  # seconds in the body
        self.kind: str | None = None
        self.detail = ""
        self.attempt = 0
        self.took: str | None = None  # the state a takeover found (running: its worker went away)
        self.span: Any = None
        self.token: Any = None

    def claimed(self, attempt: int, took: str | None) -> None:
        self.attempt, self.took = attempt, took

    def ran(self, detail: str) -> None:
        self.kind = TOOK_OVER if self.took == "running" else RAN
        self.detail = detail if self.took is None else f"{detail} (after a {self.took} claim)"


def call_id(audit: str | None, names: tuple[str, ...] = _CALL_IDS) -> str | None:
    """The host's id of this invocation, from the audit (a JSON object), at most ``CALL_ID_MAX`` characters
    (the store keeps it as every store can hold it: ``stores._attempts.storable``). ``names``: the ids to look
    for, in order."""
    if not audit:
        return None
    try:
        ids = json.loads(audit)
    except ValueError:
        return None
    if isinstance(ids, dict):
        for name in names:
            if isinstance(ids.get(name), str | int):
                return str(ids[name])[:CALL_ID_MAX]
    return None


def _refusal(exc: BaseException) -> tuple[str, str] | None:
    if isinstance(exc, KeyReuseError):
        return REFUSED, "reuse (differing: " + (", ".join(exc.differing) or "unknown arguments") + ")"
    if isinstance(exc, InProgressError):
        return REFUSED, "in progress"
    if isinstance(exc, MissingTaskError):
        return REFUSED, "missing task"
    if isinstance(exc, StoreError) and not exc.body_ran:
        return REFUSED, "store unavailable"
    if isinstance(exc, LeaseLostError):
        return LEASE_LOST, "result refused"
    if isinstance(exc, ResultNotStoredError):
        return NOT_STORED, "recorded in its place"
    if isinstance(exc, OutcomeUnknownError):
        return UNKNOWN, "held"
    return None


class Observer:
    """The ledger (None: not kept) and OpenTelemetry (whatever ``_otel.current()`` says, call by call)."""

    __slots__ = ("ledger",)

    def __init__(self, ledger: Ledger | None) -> None:
        self.ledger = ledger

    def begin(self, call: Call) -> Note | None:
        """A note for this call, or None when nothing observes it."""
        otel = _otel.current()
        if otel is None:
            if self.ledger is None:
                return None
            return Note(call)
        note = Note(call)
        note.span, note.token = otel.start(call.tool, call_id(call.audit, _TOOL_CALL_IDS))
        return note

    def end(self, note: Note, exc: BaseException | None) -> None:
        call = note.call
        kind, detail = note.kind, note.detail
        if exc is not None:
            known = _refusal(exc)
            if known is not None and (kind is None or (known[0] == UNKNOWN and kind != REPLAYED)):
                kind, detail = known
            elif kind is None:
                if note.attempt:  # claimed, and the recording raised (the result could not be stored)
                    kind, detail = NOT_STORED, type(exc).__name__
                else:  # before a claim: arguments without a canonical form, a bad option
                    kind, detail = REFUSED, type(exc).__name__
        if kind is None:
            kind, detail = RAN, "succeeded"
        elapsed = time.perf_counter() - note.started
        waited = call.waited
        guard_s = max(elapsed - note.body - waited, 0.0)
        if self.ledger is not None:
            self.ledger.add(call.scope, call.key, call.task_id, call.operation, call.tool, kind, detail,
                            note.attempt, call_id(call.audit), guard_s * 1000, waited * 1000)
        if note.span is not None:
            otel = _otel.current()
            attributes = {
                "agentguard.outcome": kind, "agentguard.outcome.detail": detail,
                "agentguard.replayed": kind == REPLAYED, "agentguard.attempt": note.attempt,
                "agentguard.scope": call.scope, "agentguard.task_id": call.task_id, "agentguard.key": call.key,
            }
            failed = None if exc is None else type(exc).__qualname__  # error.type, as the MCP SDK names it
            if otel is not None:
                otel.end(note.span, note.token, attributes, failed, call.tool, kind, guard_s, waited)
            else:  # switched off meanwhile: close what was opened
                note.span.end()

    def missing_task(self, tool: str, audit: str | None = None) -> None:
        """A call refused before it had a task (so no key): the tool alone is known."""
        if self.ledger is not None:
            self.ledger.add("", "", "", tool, tool, REFUSED, "missing task", 0, call_id(audit), None, None)
        otel = _otel.current()
        if otel is not None:
            span, token = otel.start(tool, call_id(audit, _TOOL_CALL_IDS))
            otel.end(span, token, {"agentguard.outcome": REFUSED, "agentguard.outcome.detail": "missing task"},
                     MissingTaskError.__qualname__, tool, REFUSED, 0.0, 0.0)
