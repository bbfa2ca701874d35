"""DBOS: the task id of a guarded step is its workflow id, which DBOS keeps when it recovers a workflow.

    @DBOS.step()                              # DBOS on top
    @once(guard, key="order_id")              # agentguard right above the function
    def charge(order_id: str, amount_cents: int) -> dict: ...

DBOS records a step's output only after the step returns. A crash between the provider's charge and that
record makes DBOS run the step again on recovery; with the guard, the re-run either replays the stored
result (the guard recorded it) or takes the expired claim over with the *same* downstream key, so the
provider deduplicates. A second call of the same operation in the workflow (a model re-invoking the tool)
is a new DBOS step — ``DBOS.step_id`` differs, so it is never part of the key — and is replayed.

Task id: ``task_id=`` (a callable, given None) → ``with agentguard.task(...)`` → ``DBOS.workflow_id`` → refused.
Refusals are raised as the :class:`agentguard.GuardError` they are: there is no model to talk to here.
"""

from __future__ import annotations

from typing import Any

from .._extras import require
from ._common import engine_once

require("dbos", extra="dbos", by=__name__)


def workflow_id(_context: Any = None) -> str | None:
    """``DBOS.workflow_id`` inside a workflow or step, else None."""
    from dbos import DBOS

    try:
        return DBOS.workflow_id
    except Exception:  # DBOS not launched / not inside a workflow
        return None


def registered(fn: Any) -> str | None:
    """DBOS names every function it decorates (and the function it was given): one it has registered
    already came through ``@DBOS.step()`` (or ``workflow``/``transaction``) before the guard did. On top of a
    step the guard runs in the workflow's own code: on recovery it replays without calling the step, and the
    workflow's later steps no longer line up with the ones DBOS recorded (DBOSUnexpectedStepError)."""
    name = getattr(fn, "dbos_function_name", None)
    return None if name is None else f"a function DBOS has already registered (as {name!r})"


once = engine_once(
    get_context=lambda: None,
    fallback=workflow_id,
    hint="this is not running inside a DBOS workflow",
    doc="``guard.once`` whose task id falls back to the DBOS workflow id; place it under ``@DBOS.step()``.",
    adapter=__name__,
    decorator="@DBOS.step()",
    registered=registered,
)


__all__ = ["once", "workflow_id"]
