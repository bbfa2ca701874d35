"""agentguard: make money-moving tool calls in AI-agent loops safe to repeat.

    guard = Guard()                                   # embedded SQLite by default

    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict: ...

    with task("ticket-8812"):
        await charge("o-1", 4900)                     # runs
        await charge("o-1", 4900)                     # replays the stored result
"""

import logging

from ._calls import Outcome
from ._context import current_key, current_task, task
from ._drive import current_audit
from ._errors import (
    GuardError,
    InProgressError,
    KeyReuseError,
    LeaseLostError,
    MissingTaskError,
    OutcomeUnknownError,
    ResultNotStoredError,
    StepOrderError,
    StoreError,
)
from ._events import GuardEvent
from ._guard import Guard
from ._keys import sub_key
from ._operation import Operation

__version__ = "0.1.0"

logging.getLogger("agentguard").addHandler(logging.NullHandler())

__all__ = [
    "Guard",
    "GuardError",
    "GuardEvent",
    "InProgressError",
    "KeyReuseError",
    "LeaseLostError",
    "MissingTaskError",
    "Operation",
    "Outcome",
    "OutcomeUnknownError",
    "ResultNotStoredError",
    "StepOrderError",
    "StoreError",
    "__version__",
    "current_audit",
    "current_key",
    "current_task",
    "sub_key",
    "task",
]
