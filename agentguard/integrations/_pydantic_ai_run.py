"""What the pydantic-ai decorator and capability share: the task id from ``ctx.deps``, the refusal in
pydantic-ai's convention, and the replay told to the model (imports pydantic-ai only when one of them is
used)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NoReturn

from .._errors import GuardError
from .._refusals import REPLAYED_MARK
from ._common import Replay, attribute_task_id, refusal_message

HINT = "ctx.deps carries no task_id"


def refuse(exc: GuardError) -> NoReturn:
    from pydantic_ai.exceptions import ToolFailed

    raise ToolFailed(refusal_message(exc)) from exc


def deps_task_id(ctx: Any) -> Any:
    return attribute_task_id(getattr(ctx, "deps", None))


def noted_return(value: Any, note: str) -> Any:
    """A replayed result as pydantic-ai's ``ToolReturn``: the value, unchanged, is the tool's return (the
    ``ToolReturnPart``'s content); the note goes to the model beside it, as user content; the metadata, for the
    program only, marks the replay. A ``ToolReturn`` the tool returned itself keeps its parts, after the note."""
    from pydantic_ai.messages import ToolReturn

    mark = {REPLAYED_MARK: True}
    if not isinstance(value, ToolReturn):
        return ToolReturn(return_value=value, content=note, metadata=mark)
    content = value.content
    told = [note] if content is None else [note, content] if isinstance(content, str) else [note, *content]
    metadata = value.metadata
    if metadata is None or isinstance(metadata, Mapping):
        metadata = {**(metadata or {}), **mark}
    return dataclasses.replace(value, content=told, metadata=metadata)


def call_id(ctx: Any, tool: str) -> Any:
    """The id of the model's call of ``tool`` in the run, from its ``RunContext``; None when the context is of
    another tool's call (whose body calls this one's function) or of none."""
    return getattr(ctx, "tool_call_id", None) if getattr(ctx, "tool_name", None) == tool else None


def told_in_run(value: Any, replay: Replay) -> Any:
    """The decorator's replay: told as :func:`noted_return` when an agent runs the tool, that is when the
    tool's ``RunContext`` names this very tool (``@agent.tool``) or, for a tool that takes none
    (``@agent.tool_plain``), when an agent run is in progress. Called by the program's own code outside a run,
    the value as it is."""
    from pydantic_ai import RunContext

    ctx = replay.context
    if not isinstance(ctx, RunContext):
        return value
    if ctx.tool_call_id is not None and ctx.tool_name != replay.tool:
        return value  # another tool's body calling this one's function: a call of the program's own
    return noted_return(value, replay.note)
