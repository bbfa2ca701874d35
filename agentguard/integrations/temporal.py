"""Temporal: the task id of a guarded activity is its workflow id.

    @activity.defn                            # Temporal on top
    @once(guard, key="order_id")              # agentguard right above the function
    async def charge(order_id: str, amount_cents: int) -> dict: ...

Temporal retries a failed or timed-out activity (a new attempt, same activity id) and a workflow that
calls the activity again gets a new activity id: neither is a stable key, and ``workflow_run_id`` changes on
reset and continue-as-new. ``activity.info().workflow_id`` is stable across all of them, so that is the task.

Needs the ``temporal`` extra (``pip install 'agentguard-idempotency[temporal]'``).

Task id: ``task_id=`` (a callable of ``activity.Info``) → ``with agentguard.task(...)`` → the workflow id →
refused. Refusals are raised as the :class:`agentguard.GuardError` they are; make them non-retryable in
your retry policy if a retry cannot change the answer (``KeyReuseError``, ``MissingTaskError``).
"""

from __future__ import annotations

from typing import Any

from .._extras import require
from ._common import engine_once

require("temporalio", extra="temporal", by=__name__)


def activity_info() -> Any:
    """``temporalio.activity.info()`` inside an activity (a worker's or ``ActivityEnvironment``'s), else None."""
    from temporalio import activity

    return activity.info() if activity.in_activity() else None


def workflow_id(info: Any = None) -> str | None:
    """The workflow id of the running activity, else None."""
    info = info if info is not None else activity_info()
    return getattr(info, "workflow_id", None) if info is not None else None


once = engine_once(
    get_context=activity_info,
    fallback=workflow_id,
    hint="this is not running inside a Temporal activity",
    doc="``guard.once`` whose task id falls back to the Temporal workflow id; place it under ``@activity.defn``.",
    adapter=__name__,
    decorator="@activity.defn",
)


__all__ = ["once", "workflow_id"]
