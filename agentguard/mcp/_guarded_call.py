"""A guarded tool call, through :meth:`Guard.run`: the upstream is called at most once per (scope, task,
tool + key fields), with the downstream key in ``_meta`` (and in ``forward_key_to``); its result is stored
and replayed. With ``confirm``, the user is asked first, inside the claim (``_confirm.py``).

The call runs in an exchange (``_exchange.py``): the host's request may end (a timeout, a cancellation, a
dropped connection) and the call still runs to its end and is recorded, so the retry gets its outcome. An
upstream that answers with a task (``_tasks.py``) has its handle recorded under the key and the task followed
to its end: its final result is what is stored, and a takeover follows the same task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import mcp_types as types
from mcp import MCPError

from .._drive import current_audit
from .._errors import GuardError, MissingTaskError
from .._otel import inject as trace_into
from .._refusals import refusal, replay_note, unusable_arguments
from .._shapes import shape_key
from ._config import Config, ToolConfig
from ._confirm import META_CONFIRMATION, NotConfirmed, confirm
from ._exchange import Exchange
from ._meta import ABSENT, META_KEY, TASK_ID_FIX, resolve_task_id
from ._results import (
    error_result,
    held_replay,
    not_guarded,
    outcome_unknown_held,
    outcome_unknown_retry,
    payload,
    result,
    upstream_refused,
    upstream_unavailable,
    upstream_unreachable,
)
from ._startup import Runtime
from ._tasks import TaskHandle, forget_task, record_task, recorded_task
from ._transports import _NotGuarded, _OutcomeUnknown, _Unavailable, _Unreachable

log = logging.getLogger("agentguard.mcp")

# Stored records name the class of a cached error (``module:qualname``): these two keep the name they had
# before the proxy was split into modules, so records written earlier, or by an older proxy sharing the
# store, still replay.
_STORED_AS = "agentguard.mcp.proxy"


class _RetryableError(Exception):
    """The upstream answered with an error that is not final: the claim is released for a retry."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("upstream error result")
        self.payload = payload


class _FinalError(Exception):
    """An upstream error result the config declares final: stored and replayed like a result."""

    def __init__(self, payload_json: str) -> None:
        super().__init__(payload_json)


class _HeldUnknown(Exception):
    """The outcome is unknown and the tool's policy is ``hold``: recorded, never run again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


_FinalError.__module__ = _HeldUnknown.__module__ = _STORED_AS


@dataclass
class GuardedCall:
    """One guarded ``tools/call`` as the host sent it."""

    rt: Runtime
    config: Config
    name: str
    cfg: ToolConfig
    arguments: dict[str, Any]
    meta: dict[str, Any]
    """The host's ``_meta``, where a task id may be."""
    forward: dict[str, Any]
    """What goes upstream in ``_meta`` besides the downstream key."""
    audit: dict[str, Any]
    environ: Mapping[str, str]

    async def run(self, ex: Exchange) -> types.CallToolResult:
        name, cfg, rt = self.name, self.cfg, self.rt
        arguments = dict(self.arguments)
        given = arguments.pop("task_id", ABSENT)
        try:
            task_id = resolve_task_id(name, given, self.meta, self.environ)
        except MissingTaskError as exc:
            rt.guard._machine.observer.missing_task(name, json.dumps(self.audit, default=str))  # (for the ledger)
            return error_result(refusal(exc, fix=TASK_ID_FIX))
        if cfg.forward_key_to is not None:
            arguments.pop(cfg.forward_key_to, None)  # the proxy chooses the key, never the model
        sent: str | None = None  # the downstream key, once the call went upstream

        async def on_task(handle: TaskHandle) -> None:
            await record_task(rt.guard, handle)  # before it is followed: a takeover follows the same task
            current_audit()["upstream_task"] = handle.task_id

        async def body(downstream_key: str) -> dict[str, Any]:
            nonlocal sent
            resumed = await recorded_task(rt.guard)  # an earlier attempt's task, which a takeover follows
            if resumed is not None:
                sent = downstream_key
                log.info("%s in task %r: following the upstream's task %s, which an earlier attempt started", name,
                         task_id, resumed.task_id)
                current_audit()["upstream_task"] = resumed.task_id
                return await settle(lambda: rt.upstream.follow(
                    resumed, ask=ex.ask, on_over=lambda: forget_task(rt.guard), cancel=False), downstream_key, None)
            # Checked on the connection the call goes out on (it may be new, or its tools may have changed):
            # a tool the upstream no longer offers as configured is refused, never sent unguarded.
            conn = await rt.upstream.ready_for(name)
            confirmation = None
            if cfg.confirm:
                confirmation = await confirm(ex, cfg, name, arguments, task_id)  # NotConfirmed: released
                current_audit()["confirmation"] = confirmation  # (kept beside the record, for a person)
                conn = await rt.upstream.ready_for(name)
            send = dict(arguments)
            tool = conn.tool(name)
            if given is not ABSENT and tool is not None and "task_id" in (tool.input_schema.get("properties") or {}):
                send["task_id"] = task_id  # the upstream takes a task_id of its own: it gets the one sent
            if cfg.forward_key_to:
                shape = cfg.forward_key_shape
                send[cfg.forward_key_to] = downstream_key if shape is None else shape_key(downstream_key, shape)
            sent = downstream_key
            meta = {**self.forward, META_KEY: downstream_key}
            trace_into(meta)  # the upstream's spans follow this guarded call's (the host's trace continued)
            return await settle(lambda: rt.upstream.call(
                name, send, meta, conn, progress=ex.progress, ask=ex.ask, on_task=on_task,
                on_task_over=lambda: forget_task(rt.guard), cancel_task=False), downstream_key, confirmation)

        async def settle(upstream: Callable[[], Awaitable[types.CallToolResult]], downstream_key: str,
                         confirmation: dict[str, Any] | None) -> dict[str, Any]:
            """The upstream's answer as the body's outcome: stored, or raised as what it means for the claim."""
            try:
                with ex.upstream():
                    res = await upstream()
            except _OutcomeUnknown as exc:
                if cfg.unknown_policy == "hold":
                    raise _HeldUnknown(outcome_unknown_held(name, task_id, exc)) from None
                raise
            except MCPError as exc:
                raise _RetryableError(payload(error_result(upstream_refused(name, exc.error.message)))) from None
            stored = payload(res, key=downstream_key if res.is_error and cfg.errors_final else None)
            if confirmation is not None:
                stored.setdefault("_meta", {})[META_CONFIRMATION] = confirmation
            if res.is_error and cfg.errors_final:
                # Stored with its key: a replay of a cached error gets no Outcome to take the key from.
                raise _FinalError(json.dumps(stored))
            if res.is_error:
                raise _RetryableError(stored)
            return stored

        on_conflict: Literal["wait", "raise"] = (
            "raise" if (cfg.on_conflict or self.config.proxy.on_conflict) == "error" else "wait"
        )
        try:
            outcome = await rt.guard.run(
                name, body, arguments={k: v for k, v in arguments.items() if k not in cfg.ignore},
                key={k: arguments.get(k) for k in cfg.key} or None, task_id=task_id, scope=self.config.store.scope,
                cache_errors=(_FinalError, _HeldUnknown), on_conflict=on_conflict,
                wait_timeout=cfg.wait_timeout or self.config.proxy.wait_timeout, audit=self.audit,
                on_unknown=cfg.unknown_policy,  # (a proxy killed mid-call: taken over only if the key goes upstream)
            )
        except _RetryableError as exc:
            # Not final: the claim was released, so a retry goes upstream again with the same key.
            return result(exc.payload, key=sent, replayed=False)
        except NotConfirmed as exc:
            return error_result(str(exc))
        except _FinalError as exc:
            stored = json.loads(exc.args[0])
            if sent is not None:
                return result(stored, key=sent, replayed=False)
            return result(stored, key=None, replayed=True, note=replay_note(name, task_id), mark=cfg.mark_structured)
        except _HeldUnknown as exc:
            return error_result(str(exc) if sent is not None else held_replay(str(exc)))
        except _OutcomeUnknown as exc:
            return error_result(outcome_unknown_retry(name, exc))
        except _Unavailable as exc:
            return not_sent(name, exc)
        except _NotGuarded as exc:
            return error_result(not_guarded(name, exc))
        except GuardError as exc:
            return error_result(refusal(exc, ran=sent is not None))
        except (TypeError, ValueError) as exc:
            if sent is not None:
                raise
            # Raised by the engine before the body ran: arguments without a canonical form (a lone surrogate,
            # nesting past the limit) cannot be keyed or fingerprinted.
            return error_result(unusable_arguments(name, exc))
        note = replay_note(outcome.operation, task_id) if outcome.replayed else None
        return result(outcome.value, key=outcome.key, replayed=outcome.replayed, note=note, mark=cfg.mark_structured)


def not_sent(tool: str, exc: _Unavailable) -> types.CallToolResult:
    """The upstream was not reached: a set-up error a person must fix, or a connection that just failed."""
    if isinstance(exc, _Unreachable):
        return error_result(upstream_unreachable(tool, exc))
    return error_result(upstream_unavailable(tool, exc))
