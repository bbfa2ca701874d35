"""A host's request that the proxy answers by calling its upstream, and the questions asked on the way.

While it answers, an upstream may need its host: the user (elicitation), the model (sampling), the roots; and
the proxy itself asks the user to confirm a guarded call (``confirm = true``). In the handshake era the
question goes to the host on the request it is about. On 2026-07-28 a server sends no requests: the proxy
answers the request with ``input_required`` (the questions, and a ``requestState`` that names the exchange)
and resumes when the host retries it with the answers (multi round-trip requests).

Either way the call runs in a task of the proxy, not in the host's request: a guarded call runs to its end and
is recorded whatever the host does (cancels, disconnects, never answers); any other call is cancelled with the
host's request, and the upstream is told.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.abc
import mcp_types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.connection import NotifyOnlyOutbound
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import INVALID_PARAMS, INVALID_REQUEST, REQUEST_TIMEOUT
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

log = logging.getLogger("agentguard.mcp")

R = TypeVar("R")
Answer = types.InputResponse | types.ErrorData
Ask = Callable[[types.InputRequest], Awaitable[Answer]]
Context = ServerRequestContext[Any, Any]

_MAX_ROUNDS = 10
# Exchanges that ended after a question of theirs expired, kept past the parking window for a late retry (its
# answer would otherwise start the request anew and be asked again, round after round): the latest this many.
_EXPIRED_KEPT = 256


def connection_of(ctx: Context) -> Any:
    """The host connection a request came on (mcp 2.3 keeps it on the session without a public accessor)."""
    return getattr(ctx.session, "_connection", None)


def host_of(ctx: Context) -> object:
    """Who is asking: the host's connection, the same for all its requests, whose channel reaches it between
    requests. A 2026-07-28 request over HTTP stands alone: it is its own host."""
    outbound = getattr(connection_of(ctx), "outbound", None)
    if outbound is not None and (ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
                                 or isinstance(outbound, NotifyOnlyOutbound)):
        return outbound
    return object()


def digest(method: str, name: str, arguments: Any) -> str:
    """What a retry must repeat to resume an exchange: the method, the name (or URI) and the arguments."""
    text = json.dumps([method, name, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def can_ask(ctx: Context, request: types.InputRequest) -> bool:
    """Whether the host declared the capability the question needs (a question it did not is never sent)."""
    caps = ctx.session.client_capabilities
    if caps is None:
        return False
    if isinstance(request, types.ElicitRequest):
        elicit = caps.elicitation
        if elicit is None:
            return False
        if isinstance(request.params, types.ElicitRequestURLParams):
            return elicit.url is not None
        return elicit.form is not None or elicit.url is None  # `elicitation: {}` is form mode
    if isinstance(request, types.CreateMessageRequest):
        return caps.sampling is not None and (not request.params.tools or caps.sampling.tools is not None)
    return caps.roots is not None


def _result_type(request: types.InputRequest) -> type[types.ElicitResult | types.CreateMessageResult |
                                                     types.CreateMessageResultWithTools | types.ListRootsResult]:
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    if isinstance(request, types.CreateMessageRequest):
        with_tools = request.params.tools or request.params.tool_choice
        return types.CreateMessageResultWithTools if with_tools else types.CreateMessageResult
    return types.ListRootsResult


def typed_answer(request: types.InputRequest, raw: object) -> Answer:
    """A host's answer as the result its question calls for, or an error if it is not one."""
    if isinstance(raw, types.ErrorData):
        return raw
    data = raw.model_dump(by_alias=True, mode="json", exclude_none=True) if isinstance(raw, BaseModel) else raw
    try:
        return _result_type(request).model_validate(data, by_name=False)
    except ValidationError:
        return types.ErrorData(code=INVALID_PARAMS, message=f"the client's answer to {request.method} is not valid")


def unanswered(request: types.InputRequest, why: str) -> Answer:
    """The answer to a question nobody answered: an elicitation is cancelled, anything else an error."""
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult(action="cancel")
    return types.ErrorData(code=INVALID_REQUEST, message=f"agentguard proxy: {request.method} was not answered ({why})")


def _unsupported(request: types.InputRequest) -> types.ErrorData:
    return types.ErrorData(code=INVALID_REQUEST, message=f"the client does not support {request.method}")


@dataclass(eq=False)
class _Question:
    request: types.InputRequest
    answer: Answer | None = None
    answered: anyio.Event = field(default_factory=anyio.Event)


@dataclass(eq=False)
class Exchange:
    """One host request the proxy answers by calling its upstream: a tool call, a prompt, a resource read."""

    what: str
    """For logs: the method and the tool, prompt or resource."""
    digest: str
    keep: bool
    """A guarded call: it runs to its end whatever the host does."""
    host: object
    timeout: float
    ctx: Context | None = None
    """The host's request this exchange answers now; None between rounds, and once the host went away."""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    abandoned: bool = False
    expired: bool = False
    """A question of this exchange got no answer within the timeout (a late answer is not used)."""
    upstream_calls: int = 0
    _questions: dict[str, _Question] = field(default_factory=dict)
    _asked: int = 0
    _wake: anyio.Event = field(default_factory=anyio.Event)
    _done: bool = False
    _result: Any = None
    _error: BaseException | None = None
    _scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    _asking: set[anyio.CancelScope] = field(default_factory=set)
    parked_at: float = 0.0

    def _changed(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()

    async def ask(self, request: types.InputRequest) -> Answer:
        """Put a question to the host: on its request now (handshake era), or in the next ``input_required``
        (2026-07-28). A host that cannot be asked, went away or does not answer in time answers "cancel"."""
        answer = await self.answer_to(request)
        return unanswered(request, "no answer in time") if answer is None else answer

    async def answer_to(self, request: types.InputRequest) -> Answer | None:
        """:meth:`ask`, but None when no answer came within the timeout: the question expired (and
        :attr:`expired` is set). An answer that comes later is not used: in the handshake era the host is told
        the question is cancelled; on 2026-07-28 its retry gets the outcome this exchange came to without it."""
        ctx = self.ctx
        if self.abandoned:
            return unanswered(request, "the client went away")
        if ctx is not None and not can_ask(ctx, request):
            return _unsupported(request)
        if ctx is not None and ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            answer = await self._ask_now(ctx, request)
        else:
            self._asked += 1
            question = self._questions[f"q{self._asked}"] = _Question(request)
            self._changed()
            with anyio.move_on_after(self.timeout):
                await question.answered.wait()
            self._questions = {k: q for k, q in self._questions.items() if q is not question}
            answer = question.answer
        if answer is None:
            self.expired = True
            log.info("%s: the client did not answer %s within %g s (input_timeout): the question expired", self.what,
                     request.method, self.timeout)
        return answer

    async def _ask_now(self, ctx: Context, request: types.InputRequest) -> Answer | None:
        scope = anyio.CancelScope()
        self._asking.add(scope)
        with scope:
            try:
                return await ctx.session.send_request(
                    request, _result_type(request), request_read_timeout_seconds=self.timeout,
                    metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
            except MCPError as exc:
                if exc.error.code == REQUEST_TIMEOUT:  # (the SDK tells the host it is cancelled)
                    return None
                return exc.error
            except ValidationError:
                return types.ErrorData(code=INVALID_PARAMS, message=f"the client's answer to {request.method} is "
                                                                    "not valid")
            except NoBackChannelError:
                return unanswered(request, "the client cannot be asked on this connection")
            finally:
                self._asking.discard(scope)
        return unanswered(request, "the client went away")

    def leave(self) -> None:
        """The host went away: questions in flight, and any asked later, count as cancelled."""
        self.ctx, self.abandoned = None, True
        for scope in self._asking:
            scope.cancel()

    def answer(self, responses: types.InputResponses | None) -> None:
        """The answers a 2026-07-28 host sent with its retry; a missing one is asked again."""
        for key, raw in (responses or {}).items():
            question = self._questions.get(key)
            if question is not None and question.answer is None:
                question.answer = typed_answer(question.request, raw)
                question.answered.set()
            elif question is None and self.expired:
                log.info("%s: an answer (%s) came after its question expired: not used", self.what, key)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """The upstream's progress, to the host's request now answered (none between rounds, none replayed)."""
        if self.ctx is not None:
            await self.ctx.session.report_progress(progress, total, message)

    async def notify(self, notification: types.ServerNotification) -> None:
        """A notification about this exchange, on the host's request now answered."""
        if self.ctx is not None:
            await self.ctx.session.send_notification(notification, related_request_id=self.ctx.request_id)

    @contextmanager
    def upstream(self) -> Iterator[None]:
        """While a call to the upstream is in flight: its unbidden requests and log lines may be this one's."""
        self.upstream_calls += 1
        try:
            yield
        finally:
            self.upstream_calls -= 1

    async def _next(self) -> dict[str, types.InputRequest] | None:
        """Wait until the exchange ends (None) or, for a host that is not asked directly, has questions."""
        while True:
            wake = self._wake
            if self._done:
                return None
            ctx = self.ctx
            if ctx is not None and ctx.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
                for question in self._questions.values():  # asked between rounds: this request may not answer it
                    if question.answer is None and not can_ask(ctx, question.request):
                        question.answer = _unsupported(question.request)
                        question.answered.set()
                asked = {k: q.request for k, q in self._questions.items() if q.answer is None}
                if asked:
                    return asked
            await wake.wait()

    def _finish(self, result: Any, error: BaseException | None) -> None:
        self._done, self._result, self._error = True, result, error
        self._changed()


class Exchanges:
    """The exchanges in flight (answering a host request) or parked (waiting for a 2026-07-28 host's retry)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._tg: anyio.abc.TaskGroup | None = None
        self._live: dict[Exchange, None] = {}  # in order of arrival
        self._parked: dict[str, Exchange] = {}
        self._expired: dict[str, Exchange] = {}  # parked past the window after a question expired; in that order

    def bind(self, tg: anyio.abc.TaskGroup | None) -> None:
        """The task group exchanges run in (the proxy's, while it serves)."""
        self._tg = tg

    async def serve(self, ctx: Context, *, what: str, key: str, keep: bool, resume: str | None,
                    responses: types.InputResponses | None, run: Callable[[Exchange], Awaitable[R]]
                    ) -> R | types.InputRequiredResult:
        """Answer the host's request ``ctx``: resume the exchange its ``requestState`` names (if it is one this
        proxy holds for the same request), else start one that runs ``run``."""
        ex = self._resume(resume, key, responses)
        if ex is None:
            ex = Exchange(what, key, keep, host_of(ctx), self.timeout)
            ex.ctx = ctx  # before the run starts: it may ask at once
            self._start(ex, run)
        followed: R | types.InputRequiredResult = await self._follow(ex, ctx)
        return followed

    def owner(self) -> Exchange | None:
        """The exchange an upstream message that names no call belongs to (handshake-era elicitation, sampling
        and roots requests, log lines): the one waiting for the upstream, or the oldest of those if all are
        one host's. Otherwise nobody can tell."""
        busy = [ex for ex in self._live if ex.upstream_calls]
        return busy[0] if busy and len({id(ex.host) for ex in busy}) == 1 else None

    def _start(self, ex: Exchange, run: Callable[[Exchange], Awaitable[Any]]) -> None:
        assert self._tg is not None, "the proxy is not serving"
        self._live[ex] = None

        async def runner() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                with ex._scope:
                    result = await run(ex)
            except Exception as exc:
                error = exc
            finally:
                self._live.pop(ex, None)
                ex._finish(result, error)

        self._tg.start_soon(runner)

    def _resume(self, token: str | None, key: str, responses: types.InputResponses | None) -> Exchange | None:
        now = anyio.current_time()
        for stale in [t for t, parked in self._parked.items() if now - parked.parked_at > 2 * self.timeout]:
            gone = self._parked.pop(stale)
            if gone.expired:  # its outcome stays for a late retry, which must not start it anew
                self._expired[stale] = gone
                if len(self._expired) > _EXPIRED_KEPT:
                    del self._expired[next(iter(self._expired))]
        if token is None:
            return None
        ex = self._parked.get(token) or self._expired.get(token)
        if ex is None or ex.digest != key:
            log.info("a retry's requestState names no exchange of this proxy for that request (expired, or from "
                     "before a restart): served as a new request, its answers unused")
            return None
        self._parked.pop(token, None)
        self._expired.pop(token, None)
        ex.answer(responses)
        return ex

    async def _follow(self, ex: Exchange, ctx: Context) -> Any:
        ex.ctx = ctx
        try:
            asked = await ex._next()
        except anyio.get_cancelled_exc_class():
            ex.leave()
            if ex.keep:
                log.warning("the client cancelled its request for %s (request id %s): the call runs to its end and "
                            "is recorded; a retry receives its outcome", ex.what, ctx.request_id)
            else:
                ex._scope.cancel()
            raise
        finally:
            ex.ctx = None
        if asked is not None:
            ex.token, ex.parked_at = secrets.token_urlsafe(24), anyio.current_time()
            self._parked[ex.token] = ex
            return types.InputRequiredResult(input_requests=asked, request_state=ex.token)
        if ex._error is not None:
            raise ex._error
        return ex._result


async def resolve(
    send: Callable[[types.InputResponses | None, str | None], Awaitable[BaseModel]], ask: Ask | None
) -> BaseModel:
    """An upstream's result, its ``input_required`` rounds (2026-07-28) answered by ``ask``: each question goes
    to the host, and the request is sent again with the answers. A question the host cannot answer ends it."""
    result = await send(None, None)
    for _ in range(_MAX_ROUNDS):
        if not isinstance(result, types.InputRequiredResult):
            return result
        requests = result.input_requests or {}
        answers = await ask_all(requests, ask)
        for key, answer in answers.items():
            if isinstance(answer, types.ErrorData):
                raise MCPError(INVALID_REQUEST, f"the upstream needed {requests[key].method}, which the client "
                                                f"could not answer: {answer.message}")
        if not answers:
            await anyio.sleep(0.05)  # only state to echo: the upstream asked for a retry shortly
        responses = {k: a for k, a in answers.items() if not isinstance(a, types.ErrorData)}
        result = await send(responses or None, result.request_state)
    raise MCPError(INVALID_REQUEST, f"the upstream asked for input more than {_MAX_ROUNDS} times")


async def ask_all(requests: types.InputRequests, ask: Ask | None) -> dict[str, Answer]:
    """The host's answers, asked all at once: a 2026-07-28 host gets the questions in one round."""
    answers: dict[str, Answer] = {}

    async def put(key: str, request: types.InputRequest) -> None:
        answers[key] = await ask(request) if ask is not None else unanswered(request, "no client to ask")

    async with anyio.create_task_group() as tg:
        for key, request in requests.items():
            tg.start_soon(put, key, request)
    return answers
