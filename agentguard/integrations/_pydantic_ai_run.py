"""What the pydantic-ai decorator and capability share: the task id from ``ctx.deps`` and the refusal in
pydantic-ai's convention (imports pydantic-ai only when a refusal is raised)."""

from __future__ import annotations

from typing import Any, NoReturn

from .._errors import GuardError
from ._common import attribute_task_id, refusal_message

HINT = "ctx.deps carries no task_id"


def refuse(exc: GuardError) -> NoReturn:
    from pydantic_ai.exceptions import ToolFailed

    raise ToolFailed(refusal_message(exc)) from exc


def deps_task_id(ctx: Any) -> Any:
    return attribute_task_id(getattr(ctx, "deps", None))
