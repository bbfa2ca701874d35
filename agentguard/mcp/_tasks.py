"""An upstream's task (the 2026-07-28 tasks extension, ``io.modelcontextprotocol/tasks``), followed by the proxy.

The proxy's client declares the extension to a 2026-07-28 upstream, which may then answer a ``tools/call`` with
a task handle (``resultType: "task"``) instead of its result. The proxy never hands that handle to its host: it
follows the task itself (``tasks/get`` at the upstream's poll interval; a question the task asks is put to the
host and answered with ``tasks/update``) and answers the host's ``tools/call`` with the task's final result.
The outcome of a guarded call is then recorded whatever the host does, as for any other call.

For a guarded call the handle is recorded under the call's key first, as a step of its claim: a proxy that took
the call over after another died following it follows the same task (``tasks/get``, never a second
``tools/call``). A task that ends without a result forgets its handle, so a retry calls the tool again.

A handshake-era upstream is never asked for a task: in 2025-11-25 a task is requested with the call, and the
proxy does not. An answer that is not a tool result (a task handle it did not ask for among them) is an
unknown outcome, never a result to record or a failure to retry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import ConfigDict, ValidationError

from .._drive import active_claim
from .._guard import Guard
from .._steps import ClaimSteps
from ..stores import DONE

TASKS = "io.modelcontextprotocol/tasks"
"""The extension's identifier (SEP-2663)."""

_STEP = "upstream task"
"""The step of a guarded call's claim under which the upstream's task handle is recorded."""
_ENDED = "dev.agentguard/ended"  # recorded in its place once the task ended without a result

_POLL_DEFAULT = 0.5
_POLL_BOUNDS = (0.01, 5.0)  # the upstream's suggestion, within these: never a busy loop, never minutes apart


class TaskHandle(types.Result):
    """``resultType: "task"``: the upstream will answer the call through ``tasks/get`` (a ``Task``)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str = "working"

    @property
    def state(self) -> str | None:
        """The ``requestState`` to echo on the next request about the task (a typed field of the core
        result surface cannot be declared on a claimed shape, so it is read from the extras)."""
        value = (self.model_extra or {}).get("requestState")
        return value if isinstance(value, str) else None

    @property
    def poll(self) -> float:
        return poll_interval((self.model_extra or {}).get("pollIntervalMilliseconds"))

    @property
    def ttl(self) -> float | None:
        """Seconds the upstream keeps the task from its creation (None: unlimited)."""
        value = (self.model_extra or {}).get("ttlSeconds")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class TaskState(types.Result):
    """A ``tasks/get`` answer: the task's status and, once it ended, its result or its JSON-RPC error."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_milliseconds: float | None = None
    ttl_seconds: float | None = None
    request_state: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: types.InputRequests | None = None


class TaskParams(types.RequestParams):
    task_id: str
    request_state: str | None = None


class UpdateTaskParams(TaskParams):
    input_responses: types.InputResponses


# SEP-2663: over HTTP, `Mcp-Name` carries the task id of every tasks/* request (for a balancer to route it).


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class UpdateTask(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


def poll_interval(milliseconds: object) -> float:
    """Seconds until the next ``tasks/get``: the upstream's suggestion, kept within bounds."""
    if not isinstance(milliseconds, int | float) or isinstance(milliseconds, bool):
        return _POLL_DEFAULT
    return min(max(milliseconds / 1000.0, _POLL_BOUNDS[0]), _POLL_BOUNDS[1])


async def _unresolved(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
    raise RuntimeError("the proxy follows an upstream's task itself (allow_claimed=True)")


class TasksExtension(ClientExtension):
    """The proxy's client declares the tasks extension (to a 2026-07-28 upstream only: the SDK advertises a
    claim-bearing extension where its claim is active) and receives a task handle as a :class:`TaskHandle`."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=_unresolved)]


def not_a_result(exc: ValidationError | RuntimeError) -> str:
    """Why an upstream's answer to a ``tools/call`` is not a tool result (a handshake-era task handle above all)."""
    if isinstance(exc, ValidationError):
        answered = next((e.get("input") for e in exc.errors() if isinstance(e.get("input"), dict)), None)
        if isinstance(answered, dict) and "task" in answered:
            return "the upstream server answered with a task handle, which the proxy did not ask for"
        return "the upstream server's answer is not a tool result"
    return f"the upstream server's answer is not a valid tool result ({exc})"


# -- the handle, recorded under a guarded call's key ----------------------------------------------------------


def _steps(guard: Guard) -> ClaimSteps | None:
    claim = active_claim.get()
    return None if claim is None else ClaimSteps(guard._machine, claim, guard._codec_for)


async def recorded_task(guard: Guard) -> TaskHandle | None:
    """Inside a guarded call: the upstream task an earlier attempt of it started, if it may still be followed."""
    claim = active_claim.get()
    steps = _steps(guard)
    if claim is None or steps is None or claim.attempt <= 1:  # a first attempt has nothing recorded
        return None
    for name, _seq, state, result in await steps.load():
        if name == _STEP and state == DONE and result:
            recorded = json.loads(result)
            return None if recorded.get(_ENDED) else TaskHandle.model_validate(recorded)
    return None


async def record_task(guard: Guard, handle: TaskHandle) -> None:
    """Record the upstream's task handle under the guarded call's key, before anything else is awaited."""
    steps = _steps(guard)
    if steps is not None:
        await steps.record(0, _STEP, handle.model_dump_json(by_alias=True, exclude={"meta"}))


async def forget_task(guard: Guard) -> None:
    """The recorded task ended without a result: marked so, a retry calls the tool again (with the same key)."""
    steps = _steps(guard)
    if steps is not None:
        await steps.record(0, _STEP, json.dumps({_ENDED: True}))
