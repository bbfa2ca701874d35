"""What the proxy stores for an upstream result, what it sends back, and the texts of its own refusals.

A result is stored as a plain payload (content, structuredContent, isError and a clean ``_meta``) and rebuilt
for every caller: the first one gets it with ``_meta["dev.agentguard/replayed"] = false``; a replay gets the
same payload marked as one (``_meta``, a leading text line, and ``mark_structured`` if configured). The
texts of the proxy's refusals follow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types

from .._errors import GuardError, InProgressError, KeyReuseError, LeaseLostError, MissingTaskError, StoreError
from ._meta import META_KEY, META_REPLAYED, clean_meta, nothing_executed


def error_result(message: str) -> types.CallToolResult:
    """A tool error whose text the model reads."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def payload(res: types.CallToolResult, *, key: str | None = None) -> dict[str, Any]:
    """What is stored for a result: content, structuredContent, isError and a clean _meta (with the
    downstream ``key`` it was sent under, if given, so that a replay carries it too)."""
    content = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in res.content]
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


# -- the proxy's refusals ---------------------------------------------------------------------------------


def guard_refusal(exc: GuardError, ran: bool) -> str:
    """A GuardError raised while guarding a call; ``ran``: the upstream call was made."""
    if isinstance(exc, KeyReuseError):
        differ = ", ".join(exc.differing) or "unknown arguments"
        return nothing_executed(
            f"agentguard refused to run {exc.operation}: in task {exc.task_id!r} it was already called with "
            f"different arguments (differing: {differ}). A different operation needs a different task id or "
            "key field; to repeat the first call, send exactly its arguments."
        )
    if isinstance(exc, InProgressError):
        return nothing_executed(
            f"{exc.operation} in task {exc.task_id!r} is being run by another call right now, so this call did "
            "not run it. Retry the same call shortly to get its result."
        )
    if isinstance(exc, MissingTaskError):
        return nothing_executed(f"agentguard refused to run the tool: {exc}")
    if isinstance(exc, LeaseLostError):
        return (f"{exc.operation}: the upstream call was made, but another worker took the claim over meanwhile, "
                "so this result was not recorded. Retry the same call to get the recorded result.")
    if isinstance(exc, StoreError) and (exc.body_ran or ran):
        return ("the upstream call was made but agentguard could not record its result; the claim stays held "
                "and a retry with the same task_id goes upstream with the same idempotency key after its lease.")
    if ran:
        return f"agentguard failed after the upstream call was made ({exc}); retry the same call with the same task_id."
    return nothing_executed(f"agentguard could not run the call safely ({exc}).")


def unusable_arguments(tool: str, exc: BaseException) -> str:
    """Arguments (or key values) without a canonical form: refused up front."""
    return nothing_executed(f"agentguard refused to run {tool}: {exc}.")


def upstream_unavailable(tool: str, reason: object) -> str:
    return nothing_executed(
        f"the upstream server is not available ({reason}), so {tool} was not run. Retry the same call shortly."
    )


def upstream_unavailable_passed(tool: str, reason: object) -> str:
    return f"the upstream server is not available ({reason}); {tool} was not run."


def not_guarded(tool: str, problems: object) -> str:
    return nothing_executed(
        f"agentguard refused to run {tool}: the upstream server no longer offers it as the proxy's config "
        f"describes it ({problems}), so the call cannot be guarded. It is refused until the upstream offers it "
        "again as configured."
    )


def shutting_down(tool: str) -> str:
    return nothing_executed(
        f"the agentguard proxy is shutting down, so {tool} was not run. Retry the same call shortly."
    )


def upstream_refused(tool: str, message: str) -> str:
    """The upstream answered the call with a protocol error instead of a result."""
    return f"the upstream server refused {tool}: {message}"


def outcome_unknown_retry(tool: str, reason: object) -> str:
    """Sent, no answer, and the tool forwards its key: the claim was released for a deduplicated retry."""
    return (
        f"{reason}; the outcome of {tool} is unknown. The claim was released: retry the same call with "
        "the same task_id and it goes upstream with the same idempotency key, so the provider deduplicates it."
    )


def outcome_unknown_held(tool: str, task_id: str, reason: object) -> str:
    """Sent, no answer, and the upstream cannot deduplicate: recorded as unknown, never run again."""
    return (
        f"the outcome of {tool} in task {task_id!r} is unknown: {reason}. agentguard will not run it again. "
        "Check with the provider whether it happened before doing anything else; if it did not, use a new task id."
    )


def held_replay(message: str) -> str:
    """A later call to an operation held as unknown: the first call's text, and nothing ran now."""
    return nothing_executed(f"{message} (recorded earlier)")


def outcome_unknown_passed(tool: str, reason: object) -> str:
    """An unguarded tool met a dead or silent upstream."""
    return f"{reason}; the outcome of {tool} is unknown. The proxy reconnects on the next call."


def failed_unexpectedly(tool: str) -> str:
    return (
        f"agentguard failed unexpectedly while guarding {tool}; the outcome is unknown. Retry the same call with "
        "the same task_id: it is replayed or run at most once."
    )
