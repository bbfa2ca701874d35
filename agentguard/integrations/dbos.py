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

from collections.abc import Callable, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

from .._errors import GuardError
from .._guard import Guard
from ._common import KeyArg, adapt

P = ParamSpec("P")
R = TypeVar("R")


def workflow_id(_context: Any = None) -> str | None:
    """``DBOS.workflow_id`` inside a workflow or step, else None."""
    from dbos import DBOS

    try:
        return DBOS.workflow_id
    except Exception:  # DBOS not launched / not inside a workflow
        return None


def _raise(exc: GuardError) -> NoReturn:
    raise exc


def once(
    guard: Guard,
    *,
    key: KeyArg = None,
    operation: str | None = None,
    ignore: Sequence[str] = (),
    cache_errors: tuple[type[BaseException], ...] = (),
    inject: str | None = "idempotency_key",
    task_id: Callable[[None], str] | None = None,
    scope: str | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``guard.once`` whose task id falls back to the DBOS workflow id; place it under ``@DBOS.step()``."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        wrapped: Callable[P, R] = adapt(
            guard, fn, operation=operation, key=key, ignore=ignore, cache_errors=cache_errors, inject=inject,
            task_id=task_id, scope=scope, context_names=(), get_context=lambda _arguments: None,
            fallback=workflow_id, hint="this is not running inside a DBOS workflow", refuse=_raise,
        )
        return wrapped

    return decorate


__all__ = ["once", "workflow_id"]
