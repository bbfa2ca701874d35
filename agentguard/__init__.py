"""agentguard: make money-moving tool calls in AI-agent loops safe to repeat.

    guard = Guard()                                   # embedded SQLite by default

    @guard.once(key=["order_id"])
    async def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict: ...

    with task("ticket-8812"):
        await charge("o-1", 4900)                     # runs
        await charge("o-1", 4900)                     # replays the stored result

The public names are imported when first used (a module ``__getattr__``), so ``import agentguard`` and the
``agentguard`` command's ``--help`` and ``--version`` load neither SQLAlchemy nor pydantic.
"""

import logging
from typing import TYPE_CHECKING, Any

from ._injected import INJECTED

__version__ = "0.1.0"

logging.getLogger("agentguard").addHandler(logging.NullHandler())

__all__ = [  # noqa: RUF022 - in sorted() order, as tests/core/test_guard.py asserts
    "Guard",
    "GuardError",
    "GuardEvent",
    "INJECTED",
    "InProgressError",
    "KeyReuseError",
    "LeaseLostError",
    "MissingTaskError",
    "Operation",
    "Outcome",
    "OutcomeUnknownError",
    "RecordChangedError",
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

if TYPE_CHECKING:  # what type checkers see: the names themselves
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
        RecordChangedError,
        ResultNotStoredError,
        StepOrderError,
        StoreError,
    )
    from ._events import GuardEvent
    from ._guard import Guard
    from ._keys import sub_key
    from ._operation import Operation
else:
    # Each public name -> the module that defines it, imported on first use (PEP 562).
    _WHERE = {
        "Outcome": "_calls",
        "current_key": "_context", "current_task": "_context", "task": "_context",
        "current_audit": "_drive",
        "GuardError": "_errors", "InProgressError": "_errors", "KeyReuseError": "_errors",
        "LeaseLostError": "_errors", "MissingTaskError": "_errors", "OutcomeUnknownError": "_errors",
        "RecordChangedError": "_errors", "ResultNotStoredError": "_errors", "StepOrderError": "_errors",
        "StoreError": "_errors",
        "GuardEvent": "_events",
        "Guard": "_guard",
        "sub_key": "_keys",
        "Operation": "_operation",
    }

    def __getattr__(name: str) -> Any:
        where = _WHERE.get(name)
        if where is None:
            raise AttributeError(f"module 'agentguard' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(f"agentguard.{where}"), name)
        globals()[name] = value  # once: later lookups are plain module attributes
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
