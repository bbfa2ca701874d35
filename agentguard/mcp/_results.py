"""What the proxy stores for an upstream result, what it sends back, and the texts of its own refusals.

A result is stored as a plain payload (content, structuredContent, isError and a clean ``_meta``) and rebuilt
for every caller: the first one gets it with ``_meta["dev.agentguard/replayed"] = false``; a replay gets the
same payload marked as one (``_meta``, a leading text line, and ``mark_structured`` if configured). Refusals
of a GuardError come from the one table in ``agentguard._refusals``; the texts below are about the proxy's
upstream, which only the proxy has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types

from .._refusals import nothing_executed
from ._meta import META_KEY, META_REPLAYED, clean_meta, strip_reserved


def error_result(message: str) -> types.CallToolResult:
    """A tool error whose text the model reads."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def payload(res: types.CallToolResult, *, key: str | None = None) -> dict[str, Any]:
    """What is stored for a result: content, structuredContent, isError and a clean _meta (with the
    downstream ``key`` it was sent under, if given, so that a replay carries it too)."""
    content = strip_reserved([c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in res.content])
    out: dict[str, Any] = {"content": content}
    if res.structured_content is not None:
        out["structuredContent"] = res.structured_content
    out["isError"] = bool(res.is_error)
    meta = clean_meta(res.meta)
    if key is not None:
        meta[META_KEY] = key
    if meta:
        out["_meta"] = meta
    return out


def result(stored: Mapping[str, Any], *, key: str | None, replayed: bool, note: str | None = None,
           mark: str | None = None) -> types.CallToolResult:
    """The result sent for a stored payload: marked as a replay (or not), with the downstream ``key``."""
    res = types.CallToolResult.model_validate(dict(stored))
    meta = dict(res.meta or {})
    meta[META_REPLAYED] = replayed
    if key is not None:
        meta[META_KEY] = key
    update: dict[str, Any] = {"meta": meta}
    if note is not None:
        update["content"] = [types.TextContent(type="text", text=note), *res.content]
    if replayed and mark and isinstance(res.structured_content, dict):
        update["structured_content"] = {**res.structured_content, mark: True}
    return res.model_copy(update=update)


# -- the proxy's own refusals: its upstream, its shutdown ---------------------------------------------------


def upstream_unreachable(tool: str, reason: object) -> str:
    """No connection to the upstream can be made (a wrong command, an upstream that exits at once)."""
    return nothing_executed(
        f"Not run by agentguard: the MCP proxy cannot reach its upstream server ({reason}), so {tool} was not "
        "run. Retrying will not help: a person must fix the proxy's configuration (the upstream server it "
        "starts or connects to); tell the user."
    )


def upstream_unavailable(tool: str, reason: object) -> str:
    """The upstream connection failed before the call was sent; the next call reconnects."""
    return nothing_executed(
        f"Not run by agentguard: the upstream server is not available right now ({reason}), so {tool} was not "
        "run. Retry the same call shortly."
    )


def not_guarded(tool: str, problems: object) -> str:
    return nothing_executed(
        f"Refused by agentguard: {tool} cannot be guarded, because the upstream server no longer offers it as "
        f"the proxy's config describes it ({problems}). It was not run, and it is refused until the upstream "
        "offers it as configured again: tell the user."
    )


def shutting_down(tool: str) -> str:
    return nothing_executed(
        f"Not run by agentguard: the MCP proxy is shutting down, so {tool} was not run. Retry the same call "
        "shortly."
    )


def upstream_refused(tool: str, message: str) -> str:
    """The upstream answered the call with a protocol error instead of a result."""
    return f"the upstream server refused {tool}: {message}"


def outcome_unknown_retry(tool: str, reason: object) -> str:
    """Sent, no answer, and the tool forwards its key: the claim was released for a deduplicated retry."""
    return (
        f"agentguard: the outcome of {tool} is unknown ({reason}). The claim was released: retry the same call "
        "with the same task_id; it goes upstream with the same idempotency key, so the provider deduplicates it."
    )


def outcome_unknown_held(tool: str, task_id: str, reason: object) -> str:
    """Sent, no answer, and the upstream cannot deduplicate: recorded as unknown, never run again."""
    return (
        f"agentguard: the outcome of {tool} in task {task_id!r} is unknown ({reason}), so agentguard will not "
        "run it again. Do not retry and do not issue a different call: tell the user, who can check with the "
        "provider whether it happened."
    )


def held_replay(message: str) -> str:
    """A later call to an operation held as unknown: the first call's text, and nothing ran now."""
    return nothing_executed(f"Recorded by an earlier call: {message}")


def outcome_unknown_passed(tool: str, reason: object) -> str:
    """An unguarded tool met a dead or silent upstream."""
    return f"the outcome of {tool} is unknown ({reason}). The proxy reconnects on the next call."


def task_only(tool: str) -> str:
    """A tool the upstream runs only as an MCP task, which the proxy does not relay."""
    return nothing_executed(
        f"Not run by agentguard: the upstream server runs {tool} only as an MCP task, which the proxy does not "
        "relay, so it was not run. Retrying will not help: tell the user."
    )


# A call the user did not confirm (``confirm``): why -> the text. {tool} the tool, {task} its task id.
_UNCONFIRMED = {
    "unsupported": "Refused by agentguard: {tool} needs the user's confirmation, and this client cannot ask its "
                   "user (it does not support MCP elicitation), so it was not run. Retrying will not help: tell "
                   "the user.",
    "declined": "Refused by agentguard: the user declined {tool} for task {task!r} when asked to confirm it, so "
                "it was not run. Do not retry it unless the user asks you to.",
    "unanswered": "Not run by agentguard: the user did not confirm {tool} for task {task!r} (the question was "
                  "dismissed, not answered, or answered with something other than yes or no), so it was not "
                  "run. Retry the same call if the user still wants it: they will be asked again.",
    "expired": "Not run by agentguard: the question expired. The user did not answer the confirmation of {tool} "
               "for task {task!r} within {seconds:g} s, so it was not run, and an answer given after that is not "
               "used. Retry the same call if the user still wants it: they will be asked again.",
}


def not_confirmed(why: str, tool: str, task_id: str, seconds: float = 0.0) -> str:
    """``why``: ``unsupported`` (a host without elicitation), ``declined``, ``unanswered`` or ``expired`` (no
    answer within ``seconds``)."""
    return nothing_executed(_UNCONFIRMED[why].format(tool=tool, task=task_id, seconds=seconds))


def failed_unexpectedly(tool: str) -> str:
    return (
        f"agentguard failed unexpectedly while guarding {tool}; the outcome is unknown. Retry the same call with "
        "the same task_id: it is replayed or run at most once."
    )
