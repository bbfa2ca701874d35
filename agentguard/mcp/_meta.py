"""What the proxy and guarded native servers say on the wire: ``_meta`` keys, audit ids, refusal texts.

``dev.agentguard/`` is our reverse-DNS ``_meta`` prefix; ``io.modelcontextprotocol/`` is reserved for the
protocol and is stripped (with progress tokens) before anything is stored, replayed or forwarded, so the
upstream's transport stamps (its serverInfo) never leak through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

META_TASK_ID = "dev.agentguard/task_id"
META_KEY = "dev.agentguard/idempotency_key"
META_REPLAYED = "dev.agentguard/replayed"

_RESERVED_PREFIX = "io.modelcontextprotocol/"
_TRANSPORT_KEYS = frozenset({"progressToken", "progress_token"})

TASK_ID_DESCRIPTION = (
    "The id of the task you were given (the ticket, order, invoice or job id). Reuse exactly the same "
    "task_id on any retry of this call: a repeat then returns the first result instead of acting twice."
)

# Host call ids change on every re-invocation: kept for audit, never used in a key.
_HOST_IDS = ("claudecode/toolUseId", "callId", "itemId", "threadId", "sessionId")


def clean_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """``meta`` without protocol-reserved keys and progress tokens."""
    if not meta:
        return {}
    return {k: v for k, v in meta.items() if not k.startswith(_RESERVED_PREFIX) and k not in _TRANSPORT_KEYS}


def audit_ids(
    meta: Mapping[str, Any], request_id: object, client: str | None, protocol_version: str | None
) -> dict[str, Any]:
    """The host's ids for this invocation (stored beside the record, never in the key)."""
    out: dict[str, Any] = {k: meta[k] for k in _HOST_IDS if isinstance(meta.get(k), str | int)}
    turn = meta.get("x-codex-turn-metadata")
    if isinstance(turn, Mapping) and isinstance(turn.get("turn_id"), str):
        out["codex_turn_id"] = turn["turn_id"]
    if request_id is not None:
        out["request_id"] = str(request_id)
    if client:
        out["client"] = client
    if protocol_version:
        out["protocol_version"] = protocol_version
    return out


def nothing_executed(message: str) -> str:
    """Every refusal says so plainly: some hosts show the model no error flag, only this text."""
    return f"{message.rstrip()} Nothing was executed."


def replay_note(operation: str, task_id: str) -> str:
    return (
        f"agentguard: REPLAY. {operation} already happened in task {task_id!r}; this is its recorded result, "
        "returned again. Nothing was executed again."
    )
