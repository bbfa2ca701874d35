"""What the proxy and guarded native servers put on the wire: ``_meta`` keys, the task id rule, audit ids.

(The replay note a model reads is ``agentguard._refusals.replay_note``, shared with the framework adapters.)

``dev.agentguard/`` is our reverse-DNS ``_meta`` prefix. Every prefix whose second label is
``modelcontextprotocol`` or ``mcp`` (``io.modelcontextprotocol/``, ``dev.mcp/``, ``org.mcp.tools/``) is
reserved for the protocol: such keys belong to one hop (a protocol version, a client's capabilities, a
server's identity, a subscription id), so they are stripped, with progress tokens, from everything stored,
replayed or forwarded. The one reserved key the spec asks a request to carry on is its log level
(``io.modelcontextprotocol/logLevel``), which the proxy passes to an upstream of the same era.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcp_types import LOG_LEVEL_META_KEY

from .._context import check_task_id
from .._errors import MissingTaskError
from .._refusals import REPLAYED_MARK

META_TASK_ID = "dev.agentguard/task_id"
META_KEY = "dev.agentguard/idempotency_key"
META_REPLAYED = REPLAYED_MARK

ENV_TASK_ID = "AGENTGUARD_TASK_ID"

_RESERVED_LABELS = frozenset({"modelcontextprotocol", "mcp"})
_TRANSPORT_KEYS = frozenset({"progressToken", "progress_token"})
FORWARDED: Final = frozenset({LOG_LEVEL_META_KEY})
"""Reserved keys a request carries on to an upstream of the same era: its log level (spec: logging)."""

# Where a protocol object holds someone's data rather than protocol fields: never searched for ``_meta``.
_DATA_FIELDS = frozenset({"structuredContent", "inputSchema", "outputSchema", "arguments", "requestedSchema",
                          "text", "blob", "metadata", "values"})

TASK_ID_DESCRIPTION = (
    "The id of the task you were given (the ticket, order, invoice or job id). Reuse exactly the same "
    "task_id on any retry of this call: a repeat then returns the first result instead of acting twice."
)

TASK_ID_FIX = (
    "Pass the `task_id` argument: the id of the task you were given (the ticket, order, invoice or job id) as "
    "a string, and reuse exactly the same task_id on any retry of this call. (Programs may send "
    f"_meta[{META_TASK_ID!r}] or set ${ENV_TASK_ID} instead of the argument.)"
)
"""How a model supplies the task id of a guarded MCP call (the refusal of a call without one says so)."""

# Host call ids change on every re-invocation: kept for audit, never used in a key.
_HOST_IDS = ("claudecode/toolUseId", "callId", "itemId", "threadId", "sessionId")


class _Absent:
    """The ``task_id`` argument was not sent (unlike ``null``, ``""`` or any other value, which were)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Final = _Absent()


def resolve_task_id(
    tool: str, argument: object, meta: Mapping[str, Any] | None, environ: Mapping[str, str]
) -> str:
    """The task id of a guarded MCP call, by the one rule of ``agentguard._context.check_task_id``.

    The ``task_id`` argument if it was sent at all, else ``_meta["dev.agentguard/task_id"]`` if present, else
    ``$AGENTGUARD_TASK_ID`` if set. A source that is present but unusable (a number, a list, ``""``, blank)
    is refused, never skipped: falling through to the next source would run the call under another task's
    id, and replay that task's outcome. Raises MissingTaskError (the tool was not run).
    """
    if argument is not ABSENT:
        return check_task_id(argument, source="the task_id argument", tool=tool)
    if meta is not None and META_TASK_ID in meta:
        return check_task_id(meta[META_TASK_ID], source=f"_meta[{META_TASK_ID!r}]", tool=tool)
    if ENV_TASK_ID in environ:
        return check_task_id(environ[ENV_TASK_ID], source=f"${ENV_TASK_ID}", tool=tool)
    raise MissingTaskError(f"no task id for {tool!r}; the tool was not run", operation=tool)


def reserved(key: str) -> bool:
    """Whether a ``_meta`` key is under a prefix the protocol reserves (its second label is
    ``modelcontextprotocol`` or ``mcp``): ``io.modelcontextprotocol/x`` and ``dev.mcp/x`` are,
    ``com.example.mcp/x`` and ``dev.agentguard/x`` are not."""
    prefix, slash, _name = key.partition("/")
    labels = prefix.split(".")
    return bool(slash) and len(labels) >= 2 and labels[1] in _RESERVED_LABELS


def clean_meta(meta: Mapping[str, Any] | None, *, keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``meta`` without protocol-reserved keys (but those in ``keep``) and progress tokens."""
    if not meta:
        return {}
    return {k: v for k, v in meta.items() if k in keep or (not reserved(k) and k not in _TRANSPORT_KEYS)}


def strip_reserved(value: Any) -> Any:
    """A protocol object's wire form (a result, a tool, a resource...) with reserved keys taken out of every
    ``_meta`` it holds, its own and its parts' (content blocks, resource contents, listed items). Data the
    object carries for someone else (structured content, schemas, arguments, text) is left as it is."""
    if isinstance(value, list):
        return [strip_reserved(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k == "_meta" and isinstance(v, Mapping):
            kept = clean_meta(v)
            if kept:
                out[k] = kept
        elif k in _DATA_FIELDS:
            out[k] = v
        else:
            out[k] = strip_reserved(v)
    return out


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

