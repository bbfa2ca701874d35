"""What happened to each guarded call, reported to the ``agentguard`` logger and the ``on_event`` hook."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

log = logging.getLogger("agentguard")

EventKind = Literal[
    "claimed", "completed", "replayed", "takeover", "released", "waiting", "key_reuse", "lease_lost",
    "not_stored", "held",
]

_LEVEL = {
    "claimed": logging.DEBUG, "completed": logging.DEBUG, "waiting": logging.DEBUG,
    "replayed": logging.INFO, "takeover": logging.INFO, "released": logging.INFO,
    "key_reuse": logging.WARNING, "lease_lost": logging.WARNING, "not_stored": logging.ERROR,
    "held": logging.WARNING,
}


@dataclass(frozen=True, slots=True)
class GuardEvent:
    """What happened to one guarded call; passed to the ``on_event`` hook and logged."""

    kind: EventKind
    scope: str
    task_id: str
    operation: str
    key: str
    attempt: int
    detail: str = ""


class Identified(Protocol):
    scope: str
    task_id: str
    operation: str
    key: str


class Events:
    """Reports events: to logging at the kind's level, and to the hook (whose exceptions are logged, never
    raised into the call)."""

    __slots__ = ("hook",)

    def __init__(self, hook: Callable[[GuardEvent], None] | None) -> None:
        self.hook = hook

    def emit(self, kind: EventKind, call: Identified, attempt: int, detail: str = "") -> None:
        level = _LEVEL[kind]
        if log.isEnabledFor(level):
            log.log(level, "%s %s task=%s scope=%s attempt=%d %s", kind, call.operation, call.task_id,
                    call.scope, attempt, detail)
        if self.hook is not None:
            try:
                self.hook(GuardEvent(kind, call.scope, call.task_id, call.operation, call.key, attempt, detail))
            except Exception:
                log.exception("the on_event hook raised; ignored")
