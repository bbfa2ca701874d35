"""The proxy's upstream: one MCP ``Client`` at a time, what it announces, and what a failure means for a call.

The upstream is the real MCP server the proxy guards (its transports: ``_transports.py``). Every connection
lists the upstream's tools and checks them against the config; so does every change the upstream announces.
What else the upstream sends on its own (other changes, resource updates, log lines, and in the handshake era
its requests for elicitation, sampling and roots) goes to the proxy's :class:`Relay`. The proxy subscribes the
upstream to the resources its hosts subscribed to, on every connection.

Failures are told apart by what they mean for a call (``_transports.py``): not sent, or sent and unanswered.
A 2026-07-28 upstream may answer a call with a task (``_tasks.py``): the proxy follows it to its end.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import anyio
import anyio.abc
import mcp_types as types
from mcp import Client, MCPError
from mcp.client.session import ClientRequestContext
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.subscriptions import ServerEvent, ToolsListChanged, event_to_notification
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, INVALID_REQUEST, REQUEST_TIMEOUT
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from ._exchange import Answer, Ask, ask_all, resolve
from ._tasks import (
    CancelTask,
    GetTask,
    TaskHandle,
    TaskParams,
    TasksExtension,
    TaskState,
    UpdateTask,
    UpdateTaskParams,
    not_a_result,
    poll_interval,
)
from ._transports import (
    TargetFactory,
    UpstreamTarget,
    _describe,
    _NotGuarded,
    _OutcomeUnknown,
    _Unavailable,
    _Unreachable,
    _unreachable,
)

log = logging.getLogger("agentguard.mcp")

__all__ = ["Relay", "Upstream", "UpstreamTarget"]

T = TypeVar("T")


class Relay(Protocol):
    """Where the proxy passes on what its upstream sends unasked."""

    async def ask(self, request: types.InputRequest) -> Answer:
        """A handshake-era request of the upstream's (elicitation, sampling, roots): the host's answer."""
        ...

    async def notify(self, notification: types.ServerNotification) -> None:
        """A notification of the upstream's (changes other than its tools, resource updates, log lines)."""
        ...


@dataclass(eq=False)
class _Connection:
    client: Client
    stop: anyio.Event
    tools: list[types.Tool] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)
    """Guarded tools that this upstream does not offer as configured: refused, never passed through."""
    stale: bool = False
    """The upstream said its tools changed and they were not listed again since."""
    changed: anyio.Event = field(default_factory=anyio.Event)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    resources: frozenset[str] = frozenset()
    """The resources this connection is subscribed to."""
    relisten: anyio.Event = field(default_factory=anyio.Event)

    def tool(self, name: str) -> types.Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    @property
    def modern(self) -> bool:
        return self.client.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS


Checker = Callable[[list[types.Tool]], dict[str, list[str]]]
"""Which guarded tools a tool list breaks, and how (``_config.tool_problems`` over the tools' schemas)."""


class Upstream:
    """One upstream ``Client`` at a time, held open by a task of the proxy's task group.

    A client is entered and exited in the same task, so each connection lives in its own holder task.
    When the upstream dies, the connection is dropped and the next call reconnects. Every connection lists
    the upstream's tools and checks them against the config; so does every change the upstream announces
    (``notifications/tools/list_changed``, or a ``subscriptions/listen`` event on the 2026-07-28 era). A
    guarded tool the current tools break is refused, never passed through.
    """

    def __init__(
        self, tg: anyio.abc.TaskGroup, target: TargetFactory, *, mode: str, timeout: float, check: Checker,
        on_change: Callable[[], Coroutine[Any, Any, None]] | None = None, relay: Relay | None = None,
    ) -> None:
        self._tg, self._target, self._mode, self.timeout = tg, target, mode, timeout
        self._check, self._on_change, self._relay = check, on_change, relay
        self._lock = anyio.Lock()
        self._conn: _Connection | None = None
        self._seen: tuple[str, dict[str, list[str]]] | None = None  # the last tools listed, and their problems
        self._resources: frozenset[str] = frozenset()  # what the hosts subscribed to

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        conn = self._conn
        return conn.client.server_capabilities if conn is not None else None

    @property
    def modern(self) -> bool:
        return self._conn is not None and self._conn.modern

    @property
    def instructions(self) -> str | None:
        return self._conn.client.instructions if self._conn is not None else None

    async def _hold(self, ready: anyio.Event, box: dict[str, Any]) -> None:
        conn: _Connection | None = None
        stop = anyio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification) and conn is not None:
                conn.stale = True  # at once: a guarded call arriving before the relist lists again first
                conn.changed.set()
            elif isinstance(message, types.ServerNotification) and self._relay is not None:
                await self._relay.notify(message)
            elif isinstance(message, Exception):
                log.warning("the upstream sent something that is not a message: %s", _describe(message))

        try:
            # The timeout bounds the handshake, each listing and a subscription's acknowledgment too: an
            # upstream that never answers fails the startup (or the reconnection) instead of hanging it.
            async with Client(self._target(stop), mode=self._mode, raise_exceptions=False,
                              read_timeout_seconds=self.timeout, message_handler=on_message, cache=None,
                              extensions=[TasksExtension()], **self._callbacks()) as client:
                conn = _Connection(client, stop)
                async with anyio.create_task_group() as tg:
                    # Subscribed before the first listing, so no change can fall between the two.
                    await tg.start(self._listen, conn)
                    tg.start_soon(self._follow, conn)
                    async with conn.lock:
                        await self._list(conn)
                    await self._subscribe(conn)
                    box["conn"] = conn
                    ready.set()
                    await stop.wait()
                    tg.cancel_scope.cancel()
        except Exception as exc:
            box.setdefault("error", exc)
            if conn is not None:
                log.warning("the upstream connection ended: %s", _describe(exc))
        finally:
            stop.set()
            if conn is not None and self._conn is conn:
                self._conn = None
            ready.set()
        if conn is not None:
            log.info("the upstream connection closed; the next call reconnects")

    def _callbacks(self) -> dict[str, Any]:
        """The handshake era's upstream requests, passed on to the relay (the client declares what it relays)."""
        relay = self._relay
        if relay is None:
            return {}

        async def elicit(_ctx: ClientRequestContext, params: types.ElicitRequestParams) -> Any:
            return await relay.ask(types.ElicitRequest(params=params))

        async def sample(_ctx: ClientRequestContext, params: types.CreateMessageRequestParams) -> Any:
            return await relay.ask(types.CreateMessageRequest(params=params))

        async def roots(_ctx: ClientRequestContext) -> Any:
            return await relay.ask(types.ListRootsRequest())

        return {"elicitation_callback": elicit, "sampling_callback": sample, "list_roots_callback": roots}

    async def _listen(self, conn: _Connection, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # On the 2026-07-28 era change notifications come only on a subscriptions/listen stream (the handshake
        # era sends them unasked); its events reach on_message too. A new set of resources opens a new stream.
        caps = conn.client.server_capabilities
        wanted = {"tools_list_changed": bool(caps.tools and caps.tools.list_changed),
                  "prompts_list_changed": bool(caps.prompts and caps.prompts.list_changed),
                  "resources_list_changed": bool(caps.resources and caps.resources.list_changed)}
        subscribes = bool(caps.resources and caps.resources.subscribe)
        if not conn.modern or not (any(wanted.values()) or subscribes):
            task_status.started()
            return
        started = False
        while True:
            conn.relisten = anyio.Event()
            uris = sorted(conn.resources) if subscribes else []
            try:
                async with conn.client.listen(**wanted, resource_subscriptions=uris) as events, \
                        anyio.create_task_group() as tg:
                    if not started:
                        task_status.started()
                        started = True
                    tg.start_soon(_cancel_on, conn.relisten, tg.cancel_scope)
                    async for event in events:
                        await self._event(conn, event)
                    tg.cancel_scope.cancel()
            except Exception as exc:  # the connection ended, or the upstream refused the stream
                if not started:
                    log.warning("the upstream does not send its changes (%s): its tools are checked again when a "
                                "host lists them or the proxy reconnects", _describe(exc))
                    task_status.started()
                else:
                    log.debug("the upstream's change notifications ended: %s", _describe(exc))
                return
            if not conn.relisten.is_set():
                log.debug("the upstream ended its change notifications")
                return

    async def _event(self, conn: _Connection, event: ServerEvent) -> None:
        if isinstance(event, ToolsListChanged):
            conn.stale = True
            conn.changed.set()
        elif self._relay is not None:
            await self._relay.notify(event_to_notification(event, {}))

    async def _follow(self, conn: _Connection) -> None:
        while True:
            await conn.changed.wait()
            conn.changed = anyio.Event()
            try:
                await self.refresh(conn)
            except _Unavailable as exc:
                log.warning("could not list the upstream's tools after it announced a change: %s", exc)

    async def _list(self, conn: _Connection, *, announce: bool = True) -> None:
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await conn.client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        problems = self._check(tools)
        conn.tools, conn.problems = tools, problems
        listed = json.dumps([t.model_dump(mode="json", by_alias=True) for t in tools], sort_keys=True)
        seen, self._seen = self._seen, (listed, problems)
        if seen is None:
            return  # the first listing: checked by the proxy's startup, which refuses to serve on a problem
        if problems != seen[1]:
            for name in sorted(problems):
                log.error("%s is not guarded any more, so every call to it is refused: %s", name,
                          "; ".join(problems[name]))
            for name in sorted(set(seen[1]) - set(problems)):
                log.warning("%s matches the config again: it is guarded", name)
        if announce and listed != seen[0] and self._on_change is not None:
            self._tg.start_soon(self._on_change)

    async def refresh(self, conn: _Connection, *, announce: bool = True) -> None:
        """List the upstream's tools again (and check them); ``announce``: tell the host if they changed.
        Raises _Unavailable if the connection failed."""
        async with conn.lock:
            conn.stale = False  # a change announced while listing marks it stale again
            try:
                await self._list(conn, announce=announce)
            except Exception as exc:
                conn.stale = True
                if isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED:
                    raise _Unavailable(f"it failed to list its tools ({exc.error.message})") from exc
                self.drop(conn)
                raise _Unavailable(f"the connection ended while listing its tools ({_describe(exc)})") from exc

    # -- resources the hosts subscribed to ------------------------------------------------------------------

    async def subscribe(self, resources: frozenset[str]) -> None:
        """Subscribe the upstream to exactly these resources (the union of the hosts' subscriptions)."""
        self._resources = resources
        conn = self._conn
        if conn is not None and not conn.stop.is_set():
            await self._subscribe(conn)

    async def _subscribe(self, conn: _Connection) -> None:
        want, had = self._resources, conn.resources
        if want == had:
            return
        conn.resources = want
        if conn.modern:
            conn.relisten.set()
            return
        requests: list[types.ClientRequest] = [
            *(types.SubscribeRequest(params=types.SubscribeRequestParams(uri=u)) for u in sorted(want - had)),
            *(types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=u)) for u in sorted(had - want)),
        ]
        for request in requests:
            try:
                await conn.client.session.send_request(request, types.EmptyResult)
            except MCPError as exc:
                log.warning("the upstream refused %s: %s", request.method, exc.error.message)

    # -- the connection ------------------------------------------------------------------------------------

    async def connect(self) -> _Connection:
        """The live connection, or a new one. Raises _Unreachable if none can be made."""
        conn = self._conn
        if conn is not None and not conn.stop.is_set():
            return conn
        async with self._lock:
            conn = self._conn
            if conn is not None and not conn.stop.is_set():
                return conn
            ready, box = anyio.Event(), dict[str, Any]()
            self._tg.start_soon(self._hold, ready, box)
            await ready.wait()
            if "conn" not in box or box["conn"].stop.is_set():
                raise _Unreachable(_unreachable(box.get("error")))
            self._conn = box["conn"]
            log.info("connected to the upstream (%d tools)", len(box["conn"].tools))
            return self._conn

    async def ready_for(self, name: str) -> _Connection:
        """The connection to call guarded tool ``name`` on, its tools current. Raises _Unavailable or
        _NotGuarded: either way nothing was sent."""
        conn = await self.connect()
        if conn.stale:
            await self.refresh(conn)
        problems = conn.problems.get(name)
        if problems:
            raise _NotGuarded(problems)
        return conn

    def drop(self, conn: _Connection) -> None:
        conn.stop.set()
        if self._conn is conn:
            self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            self.drop(self._conn)

    async def request(self, send: Callable[[Client], Awaitable[T]]) -> T:
        """Any request but a tool call (a listing, a read, a completion...), passed through: raises MCPError,
        with ``CONNECTION_CLOSED`` when the upstream cannot be reached or hung up."""
        try:
            conn = await self.connect()
        except _Unavailable as exc:
            raise MCPError(CONNECTION_CLOSED, f"agentguard proxy: the upstream server is unavailable ({exc})") from None
        try:
            return await send(conn.client)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.drop(conn)
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            self.drop(conn)
            raise MCPError(CONNECTION_CLOSED, "agentguard proxy: the upstream server closed the connection") from None

    async def call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any], conn: _Connection | None = None, *,
        progress: ProgressFnT | None = None, ask: Ask | None = None,
        on_task: Callable[[TaskHandle], Awaitable[None]] | None = None,
        on_task_over: Callable[[], Awaitable[None]] | None = None, cancel_task: bool = True,
    ) -> types.CallToolResult:
        """Call upstream (on ``conn`` if given), its progress to ``progress``, its questions (2026-07-28) to
        ``ask``. Answered with a task, the call is :meth:`follow` ed to its end, ``on_task`` told the handle
        first. Raises _Unavailable (not sent), _OutcomeUnknown (sent, no answer) or MCPError."""
        conn = conn if conn is not None else await self.connect()

        async def send(answers: types.InputResponses | None, state: str | None) -> Any:
            return await conn.client.session.call_tool(
                name, arguments, read_timeout_seconds=self.timeout, progress_callback=progress,
                input_responses=answers, request_state=state, meta=cast("types.RequestParamsMeta", meta),
                allow_input_required=True, allow_claimed=True,
            )

        try:
            result = await resolve(send, ask)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.drop(conn)
                raise _OutcomeUnknown("the upstream server closed the connection mid-call") from exc
            if exc.code == REQUEST_TIMEOUT:
                raise _OutcomeUnknown(f"the upstream server did not answer within {self.timeout:g}s") from exc
            if exc.code == INTERNAL_ERROR:
                raise _OutcomeUnknown(f"the upstream server failed mid-call ({exc.error.message})") from exc
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            self.drop(conn)
            raise _OutcomeUnknown("the upstream server closed the connection mid-call") from exc
        except (ValidationError, RuntimeError) as exc:
            # It was sent and answered with something the proxy cannot record as the call's result: what the
            # upstream did is unknown (released to be sent again, it might act twice).
            raise _OutcomeUnknown(not_a_result(exc)) from exc
        if isinstance(result, TaskHandle):
            if on_task is not None:
                await on_task(result)
            return await self.follow(result, ask=ask, on_over=on_task_over, cancel=cancel_task)
        assert isinstance(result, types.CallToolResult)
        return result

    async def follow(
        self, handle: TaskHandle, *, ask: Ask | None = None, on_over: Callable[[], Awaitable[None]] | None = None,
        cancel: bool = True,
    ) -> types.CallToolResult:
        """The final result of the upstream's task ``handle``: ``tasks/get`` at the upstream's interval, the task's
        questions put to ``ask`` and answered with ``tasks/update``. ``cancel``: if the follower is cancelled,
        the upstream is asked to cancel the task too (a call passed through; a guarded call is never cancelled).

        Raises _OutcomeUnknown (the task was cancelled or lost upstream, outlived its ``ttlSeconds``, or could not
        be asked about) or MCPError (it failed with that JSON-RPC error); ``on_over`` is awaited first when the
        task ended without a result."""
        task, state, delay, ttl = handle.task_id, handle.state, handle.poll, handle.ttl
        answered: set[str] = set()
        started = anyio.current_time()
        try:
            while True:
                await anyio.sleep(delay)
                now, conn = await self._poll(task, state, on_over)
                state, delay = now.request_state, poll_interval(now.poll_interval_milliseconds)
                ttl = now.ttl_seconds if "ttl_seconds" in now.model_fields_set else ttl
                if now.status not in ("completed", "failed", "cancelled") and ttl is not None and (
                        anyio.current_time() - started > ttl):
                    # Past its time to live the upstream may drop it at any moment (SEP-2663): not followed on.
                    if on_over is not None:
                        await on_over()
                    raise _OutcomeUnknown(f"the upstream server's task {task} did not end within its time to live "
                                          f"({ttl:g}s)")
                if now.status == "input_required":
                    await self._answer(conn, task, state, now, answered, ask)
                elif now.status in ("completed", "failed", "cancelled"):
                    return await _ended(task, now, on_over)
        except anyio.get_cancelled_exc_class():
            if cancel:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await self._cancel(task, state)
            raise

    async def _poll(self, task: str, state: str | None, on_over: Callable[[], Awaitable[None]] | None
                    ) -> tuple[TaskState, _Connection]:
        """One ``tasks/get``. A connection that fails is made again (the task lives on upstream) for up to the
        upstream timeout; an upstream that no longer knows the task ends it."""
        failing_since, delay = anyio.current_time(), 0.1
        while True:
            conn: _Connection | None = None
            try:
                conn = await self.connect()
                now = await conn.client.session.send_request(
                    GetTask(params=TaskParams(task_id=task, request_state=state)), TaskState,
                    request_read_timeout_seconds=self.timeout)
                return now, conn
            except (MCPError, ValidationError) as exc:
                if isinstance(exc, ValidationError) or exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                    if on_over is not None:
                        await on_over()
                    why = exc.error.message if isinstance(exc, MCPError) else "its answer is not a task"
                    raise _OutcomeUnknown(f"the upstream server no longer answers for its task {task} ({why})") from exc
                failed: BaseException = exc
            except (_Unavailable, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
                failed = exc
            if conn is not None and not (isinstance(failed, MCPError) and failed.code == REQUEST_TIMEOUT):
                self.drop(conn)  # it failed: the next poll reconnects
            if anyio.current_time() - failing_since > self.timeout:
                raise _OutcomeUnknown(f"the upstream server could not be asked about its task {task} for "
                                      f"{self.timeout:g}s ({_describe(failed)})") from failed
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _answer(self, conn: _Connection, task: str, state: str | None, now: TaskState, answered: set[str],
                      ask: Ask | None) -> None:
        """Put the task's new questions to the host (each once: a poll repeats the outstanding ones); their
        answers go upstream with ``tasks/update``."""
        asked = {k: r for k, r in (now.input_requests or {}).items() if k not in answered}
        if not asked:
            return
        answers = await ask_all(asked, ask)
        for key, answer in answers.items():
            if isinstance(answer, types.ErrorData):
                raise MCPError(INVALID_REQUEST, f"the upstream's task {task} needed {asked[key].method}, which the "
                                                f"client could not answer: {answer.message}")
        answered.update(answers)
        responses = {k: a for k, a in answers.items() if not isinstance(a, types.ErrorData)}
        await conn.client.session.send_request(
            UpdateTask(params=UpdateTaskParams(task_id=task, request_state=state, input_responses=responses)),
            types.EmptyResult, request_read_timeout_seconds=self.timeout)

    async def _cancel(self, task: str, state: str | None) -> None:
        """Ask the upstream to cancel its task (cooperative: it may finish all the same)."""
        conn = self._conn
        if conn is None or conn.stop.is_set():
            return
        try:
            await conn.client.session.send_request(CancelTask(params=TaskParams(task_id=task, request_state=state)),
                                                   types.EmptyResult, request_read_timeout_seconds=5)
            log.info("asked the upstream to cancel its task %s, as its call was cancelled", task)
        except Exception as exc:  # best effort: the call is cancelled either way
            log.info("could not ask the upstream to cancel its task %s: %s", task, _describe(exc))


async def _ended(task: str, now: TaskState, on_over: Callable[[], Awaitable[None]] | None) -> types.CallToolResult:
    """A task that reached a terminal status: its result, or what its end means for the call."""
    if now.status == "completed":
        with contextlib.suppress(ValidationError):
            return types.CallToolResult.model_validate(now.result or {}, by_name=False)
    if on_over is not None:
        await on_over()
    if now.status == "completed":
        raise _OutcomeUnknown(f"the result of the upstream server's task {task} is not a tool result")
    if now.status == "cancelled":
        said = f" ({now.status_message})" if now.status_message else ""
        raise _OutcomeUnknown(f"the upstream server cancelled its task {task} before it completed{said}")
    try:
        error = types.ErrorData.model_validate(now.error or {}, by_name=False)
    except ValidationError:
        error = types.ErrorData(code=INTERNAL_ERROR, message=now.status_message or "the task failed")
    if error.code == INTERNAL_ERROR:
        raise _OutcomeUnknown(f"the upstream server's task {task} failed ({error.message})")
    raise MCPError.from_error_data(error)


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
