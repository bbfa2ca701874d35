"""A person confirms before a guarded call first runs (``confirm = true`` on the tool).

The question is asked inside the claim, before the upstream is called: a replay never asks, and of identical
calls racing each other only the one that claims asks. It is an MCP elicitation showing the tool, its
arguments and the task. Only an explicit yes runs the call. A no, a dismissal, an answer that is not a yes or
a no, or a host that goes away refuses it (nothing was executed) and releases the claim, so that a later,
confirmed call can run. A host that cannot ask its user (no elicitation capability) is refused, unless the
tool's config says ``confirm_without_elicitation = "run"``.

A question not answered within ``input_timeout`` expires: the call is refused, saying so, and its claim
released at once (a call waiting behind it goes on); an answer that comes later is not used. In the handshake
era the host's request gets the refusal then, and the host is told the question is cancelled. On 2026-07-28 the
host's retry brings the late answer and gets the refusal, never the question again (it was asked again, round
after round, until the host gave up). Honouring a late yes would run the call on a claim that is no longer the
asker's, after other calls may have come and gone; the model's retry asks again.

Who confirmed (the client and its request), when, and the answer are kept with the recorded result
(``_meta["dev.agentguard/confirmation"]``) and logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import UTC, datetime
from typing import Any, Final

import mcp_types as types
from pydantic import ValidationError

from .._drive import current_audit
from .._errors import NotStarted
from ._config import ToolConfig
from ._exchange import Context, Exchange, can_ask
from ._results import not_confirmed

log = logging.getLogger("agentguard.mcp")

META_CONFIRMATION: Final = "dev.agentguard/confirmation"

_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "title": "Run it now",
                               "description": "Yes runs it once; no leaves it undone."}},
    "required": ["confirm"],
}


class NotConfirmed(NotStarted):
    """The user did not confirm the call: nothing ran, and the claim is released without binding its arguments
    (a corrected call runs with its own). The message is the text the model reads."""


def question(tool: str, arguments: dict[str, Any], task_id: str) -> types.ElicitRequest:
    shown = json.dumps(arguments, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    message = (f"Confirm before it runs: {tool} for task {task_id!r}, with these arguments:\n{shown}\n\n"
               "It runs once; a repeat of this call returns its recorded result.")
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=_SCHEMA))


async def confirm(ex: Exchange, cfg: ToolConfig, tool: str, arguments: dict[str, Any], task_id: str
                  ) -> dict[str, Any]:
    """Ask; the confirmation's record, or :class:`NotConfirmed`."""
    ctx = ex.ctx
    request = question(tool, arguments, task_id)
    record: dict[str, Any] = {"tool": tool, "task_id": task_id, **_who(ctx)}
    if ctx is not None and not can_ask(ctx, request):
        if cfg.confirm_without_elicitation == "run":
            log.warning("%s in task %r runs unconfirmed: the client cannot ask its user (no elicitation), and the "
                        "config says to run it then", tool, task_id)
            return {**record, "confirmed": False, "ran_unconfirmed": "the client does not support elicitation"}
        raise NotConfirmed(not_confirmed("unsupported", tool, task_id))
    answer = await ex.answer_to(request)
    record["at"] = datetime.now(UTC).isoformat(timespec="seconds")
    if answer is None:
        log.warning("%s in task %r was not run: the question expired (no answer within %g s)", tool, task_id,
                    ex.timeout)
        current_audit()["confirmation"] = {**record, "confirmed": False, "answer": "expired"}
        raise NotConfirmed(not_confirmed("expired", tool, task_id, ex.timeout))
    if isinstance(answer, types.ElicitResult) and answer.action == "accept" and (answer.content or {}).get(
            "confirm") is True:
        log.info("%s in task %r confirmed by the user of %s", tool, task_id, record.get("by", "the client"))
        return {**record, "confirmed": True}
    no = isinstance(answer, types.ElicitResult) and (
        answer.action == "decline" or (answer.action == "accept" and (answer.content or {}).get("confirm") is False))
    log.warning("%s in task %r was not run: the user %s", tool, task_id, "declined it" if no else "did not confirm it")
    # Kept beside the released record, for a person: who was asked, when, and the answer.
    current_audit()["confirmation"] = {**record, "confirmed": False, "answer": "declined" if no else "unanswered"}
    raise NotConfirmed(not_confirmed("declined" if no else "unanswered", tool, task_id))


def _who(ctx: Context | None) -> dict[str, Any]:
    if ctx is None:
        return {}
    out: dict[str, Any] = {"request_id": str(ctx.request_id)}
    name = client_name(ctx)
    if name:
        out["by"] = name
    headers = getattr(ctx.request, "headers", None)
    session = headers.get("mcp-session-id") if headers is not None else None
    if session:
        out["session"] = session
    return out


def client_name(ctx: Context) -> str | None:
    """``name/version`` of the host's client, as it introduced itself (handshake, or the request's envelope)."""
    try:
        params = ctx.session.client_params
        info = None if params is None else params.client_info
    except Exception:  # in-process connections may have no handshake params
        info = None
    raw = (ctx.meta or {}).get(types.CLIENT_INFO_META_KEY)
    if info is None and isinstance(raw, dict):
        with contextlib.suppress(ValidationError):  # self-reported, for audit only: a malformed one is left out
            info = types.Implementation.model_validate(raw)
    return None if info is None else f"{info.name}/{info.version}"
