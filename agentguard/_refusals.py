"""What a model reads when agentguard did not run a tool (or ran it but cannot hand back its outcome), and the
note that tells it a result is a replay.

One table for every caller: the framework adapters (pydantic-ai, OpenAI Agents, LangChain) and both MCP
paths (the guarding proxy and guarded native tools) turn a :class:`GuardError` into text with
:func:`refusal`. Each text says what happened, whether anything ran, and what to do next: retry the same
call, do not change the arguments, or tell the user. A text for a call where nothing ran ends with
"Nothing was executed.": some hosts show the model only the text, never an error flag. Nothing here
imports a framework or ``mcp``; the proxy's texts about its upstream live in ``agentguard.mcp._results``.
"""

from __future__ import annotations

from typing import Final

from . import _errors as errors
from ._errors import GuardError
from ._operation import StepOrderError
from ._redact import redact_text

NOTHING_EXECUTED: Final = "Nothing was executed."

NO_TASK_FIX: Final = "This is a configuration problem of the application: retrying will not help; tell the user."
"""What to do about a missing task id when the model cannot supply one (the adapters' case)."""

# (kind, ran) -> text. ``ran``: False, nothing ran (the text gets NOTHING_EXECUTED); True, the tool ran;
# None, it may have run in part. Placeholders: {op} the operation, {task} "in task '...'", {reason} the
# error's own message, {differing} the arguments that differ, {fix} how to supply a task id.
_TABLE: Final[dict[tuple[type[GuardError], bool | None], str]] = {
    (errors.KeyReuseError, False): (
        "Refused by agentguard: {op} was already called {task} with different arguments (differing: "
        "{differing}): {earlier}. This call was not run. Do not retry with changed arguments: "
        "to repeat the earlier call, send exactly its arguments; if a second, different operation is really "
        "intended, ask the user, as it needs a task of its own."
    ),
    (errors.InProgressError, False): (
        "Not run by agentguard: {op} is being run {task} by another call right now, so its outcome is not "
        "known yet. Do not assume it failed and do not change the arguments: retry the same call shortly to "
        "receive its result."
    ),
    (errors.MissingTaskError, False): (
        "Refused by agentguard: {reason}, so {op} cannot be made safe to repeat and was not run. {fix}"
    ),
    (errors.LeaseLostError, True): (
        "agentguard: {op} ran {task}, but its claim expired meanwhile and another worker took it over, so this "
        "result was not recorded and the other worker's outcome stands. Do not change the arguments: retry the "
        "same call to receive the recorded outcome."
    ),
    (errors.StoreError, False): (
        "Not run by agentguard: agentguard's store could not be used ({reason}), so {op} was not run. Do not "
        "issue a different call: retry the same call later, and if the store stays unavailable, tell the user."
    ),
    (errors.StoreError, True): (
        "agentguard: {op} ran and may have taken effect, but its outcome could not be recorded ({reason}). The "
        "claim stays held until its lease expires; a retry after that goes out again under the same "
        "idempotency key. Do not issue a different call: retry the same call later, or tell the user."
    ),
    (errors.OutcomeUnknownError, False): (
        "Not run by agentguard: the outcome of {op} is unknown ({reason}), so it is held for a person to "
        "settle and was not run again. Do not retry and do not issue a different call: tell the user."
    ),
    (StepOrderError, None): (
        "agentguard stopped {op}: this attempt ran the tool's steps in another order than an earlier one "
        "({reason}). The step out of order was not run, but earlier steps of this attempt may have been. This "
        "is a fault in the tool, not in the call: do not retry; tell the user."
    ),
    (GuardError, False): (
        "Not run by agentguard: {op} could not be run safely ({reason}). Do not issue a different call: retry "
        "the same call once, and if it is refused again, tell the user."
    ),
    (GuardError, True): (
        "agentguard: {op} ran, but agentguard failed afterwards ({reason}). Do not issue a different call: "
        "retry the same call with the same arguments to receive its outcome."
    ),
    (GuardError, None): (
        "agentguard could not complete {op} ({reason}). Do not issue a different call: retry the same call "
        "once, and if it fails again, tell the user."
    ),
}

# Whether the tool ran, where the kind of error decides it (elsewhere the error or the caller says).
_RAN: Final[dict[type[GuardError], bool | None]] = {
    errors.KeyReuseError: False, errors.InProgressError: False, errors.MissingTaskError: False,
    errors.LeaseLostError: True, errors.OutcomeUnknownError: False, StepOrderError: None,
}

# Endings of the engine's messages that a text says in its own words.
_SAID_ELSEWHERE = ("; the tool was not run", " Nothing was run.", ".")


def nothing_executed(text: str) -> str:
    """``text`` ending with "Nothing was executed." (for a refusal where nothing ran)."""
    return f"{text.rstrip()} {NOTHING_EXECUTED}"


def refusal(exc: GuardError, *, ran: bool | None = None, fix: str = NO_TASK_FIX) -> str:
    """The text for ``exc``. ``ran``: whether the caller knows the tool body ran (None: it cannot tell);
    used where the kind of error leaves it open. ``fix``: how to supply a task id, for a MissingTaskError."""
    state = _state(exc, ran)
    text = _template(exc, state).format(
        op=f"`{exc.operation}`" if exc.operation else "this tool call",
        task=f"in task {exc.task_id!r}" if exc.task_id else "in this task",
        reason=_reason(exc),
        differing=", ".join(getattr(exc, "differing", ())) or "some arguments",
        earlier=getattr(exc, "earlier", "") or "the earlier call stands",
        fix=fix,
    )
    return redact_text(nothing_executed(text) if state is False else text)


REPLAYED_MARK: Final = "dev.agentguard/replayed"
"""The key that marks a replay for the program, never for the model: MCP ``_meta`` and the adapters' metadata
(pydantic-ai's ``ToolReturn.metadata``, LangChain's ``ToolMessage.response_metadata``, AG2's ``ToolResult``)."""


def replay_note(operation: str, task_id: str) -> str:
    """What a model reads beside a replayed result (the MCP paths and every adapter that can tell it)."""
    return (
        f"agentguard: REPLAY. {operation} already happened in task {task_id!r}; this is its recorded result, "
        "returned again. Nothing was executed again."
    )


def unusable_arguments(tool: str, exc: BaseException) -> str:
    """The text for arguments that have no canonical form (a lone surrogate, nesting past the limit), which
    :meth:`Guard.run` refuses with TypeError or ValueError before anything runs."""
    return nothing_executed(
        f"Refused by agentguard: the arguments of `{tool}` cannot be fingerprinted ({exc}), so the call was not "
        "run. Fix the arguments and call again."
    )


def _state(exc: GuardError, ran: bool | None) -> bool | None:
    for cls, state in _RAN.items():
        if isinstance(exc, cls):
            return state
    if isinstance(exc, errors.StoreError):
        return exc.body_ran or bool(ran)
    return ran


def _template(exc: GuardError, state: bool | None) -> str:
    for cls in type(exc).__mro__:  # the most specific kind in the table; GuardError has every state
        if issubclass(cls, GuardError) and (template := _TABLE.get((cls, state))) is not None:
            return template
    raise AssertionError(f"no refusal text for {type(exc).__name__}")  # pragma: no cover


def _reason(exc: GuardError) -> str:
    reason = exc.message.strip()
    for ending in _SAID_ELSEWHERE:
        reason = reason.removesuffix(ending)
    return reason
