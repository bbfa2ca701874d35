"""The console's web application (Starlette): four pages and one action.

    GET  /                      tasks (newest first; filters: scope, state, operation) and the held outcomes
    GET  /task?scope=S&id=T     a task's timeline (SVG: its records, their steps, the ledger's attempts)
    GET  /record?scope=S&key=K  one record: its steps, its values (to the token's holder), settle forms
    POST /settle                settle a held operation: exactly ``Guard.resolve``, as ``agentguard resolve``

Any page opened with ``?token=...`` signs the browser in (a cookie) and redirects to itself without it. The
action is refused (403) without the token's cookie and the form's anti-forgery field (``_auth``). Bad input
(malformed JSON, an unknown key, a key no longer held, a second settle) is answered with a page that says
what was wrong, and nothing is changed in the store.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .._context import id_problem
from .._errors import GuardError, StoreError
from .._guard import Guard
from .._redact import redact_text
from ..stores import SQLStore
from ..stores import _views as views
from ..stores._attempts import DROPPED
from . import _pages as pages
from ._auth import Gate
from ._timeline import rows_of_attempts, svg

MAX_FORM = 1 << 20  # bytes: a step's result is a provider's answer, not a file
SETTLED = {
    "result": "the step's result was recorded: the next call of this operation goes on from there",
    "retry": "the step was cleared: the next call of this operation runs it again, with the same sub-key",
    "abandon": "the operation was abandoned: every later call of it errors",
}
MAX_ATTEMPTS = 2000  # ledger entries drawn on a task's timeline (the oldest first)
LIMITS = {"scope": 255, "task": 1000, "key": 64, "operation": 1000}


class BadInput(Exception):
    """A request the console cannot answer as asked: the page says why, with this HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Console:
    """One console on one store: the guard whose ``resolve`` settles, its store for the pages' reads."""

    def __init__(self, url: str, gate: Gate) -> None:
        self.store = SQLStore(url)
        self.guard = Guard(store=self.store)
        self.gate = gate

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.guard.aclose()

    def app(self) -> Starlette:
        def route(path: str, fn: Callable[[Request], Awaitable[Response]], method: str = "GET") -> Route:
            return Route(path, self._entry(fn), methods=[method])

        return Starlette(routes=[route("/", self.tasks), route("/task", self.task), route("/record", self.record),
                                 route("/settle", self.settle, "POST")], lifespan=self.lifespan)

    # -- what every request passes through ---------------------------------------------------------------

    def _frame(self, request: Request, **notes: str | None) -> pages.Frame:
        signed_in = self.gate.signed_in(request.cookies)
        return pages.Frame(signed_in, self.gate.csrf if signed_in else "", **notes)

    def _entry(self, fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not self.gate.host_allowed(request.headers.get("host")):
                return HTMLResponse("<p>This console answers only to the address it listens on.</p>", 403)
            token = request.query_params.get("token")
            if token is not None and request.method == "GET":
                return self._sign_in(request, token)
            try:
                return await fn(request)
            except BadInput as exc:
                return self._message(request, str(exc), exc.status)
            except StoreError as exc:
                return self._message(request, redact_text(str(exc)), 503)
            except GuardError as exc:
                return self._message(request, str(exc), exc.status or 400)

        return endpoint

    def _sign_in(self, request: Request, token: str) -> Response:
        if not self.gate.token_matches(token):
            return self._message(request, "that token is not this console's: use the URL printed at its start", 403)
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, 303)
        response.set_cookie(self.gate.cookie, self.gate.session_value(), httponly=True, samesite="strict")
        return response

    def _message(self, request: Request, error: str, status: int) -> Response:
        return HTMLResponse(pages.message_page(self._frame(request, error=error), "Not done"), status)

    def _arg(self, request: Request, name: str, what: str, *, required: bool = True) -> str | None:
        value = request.query_params.get(name)
        if value is None or value == "":
            if required:
                raise BadInput(f"the address lacks its {what} ({name}=...)")
            return None
        return _checked(value, what)

    # -- pages -------------------------------------------------------------------------------------------

    async def tasks(self, request: Request) -> Response:
        scope = self._arg(request, "scope", "scope", required=False) or None
        state = request.query_params.get("state") or None
        if state is not None and state not in views.STATES:
            raise BadInput(f"state must be one of {', '.join(views.STATES)}, got {state!r}")
        operation = self._arg(request, "operation", "operation", required=False)
        now, rows = await views.tasks(self.store, scope=scope, state=state, operation=operation)
        held = await self.guard.unknown(scope=scope, limit=100)
        filters = {k: v for k, v in (("scope", scope), ("state", state), ("operation", operation)) if v}
        return HTMLResponse(pages.tasks_page(self._frame(request), now, rows, held, filters))

    async def task(self, request: Request) -> Response:
        scope, task_id = self._arg(request, "scope", "scope"), self._arg(request, "id", "task")
        assert scope is not None and task_id is not None
        now, records = await views.task(self.store, scope, task_id)
        # what each call came to, from the ledger (an operation forgotten or swept keeps its attempts)
        attempts = [a for a in await self.guard.attempts(task_id=task_id, scope=scope, limit=MAX_ATTEMPTS)
                    if a.kind != DROPPED]
        if not records and not attempts:
            raise BadInput(f"no records or attempts of task {task_id!r} in scope {scope!r}", 404)
        rows = rows_of_attempts(records, attempts, now, lambda key: pages.record_href(scope, key))
        picture = svg(rows, title=f"timeline of task {task_id}")
        return HTMLResponse(pages.task_page(self._frame(request), scope, task_id, now, records, picture,
                                            len(attempts)))

    async def record(self, request: Request) -> Response:
        scope, key = self._arg(request, "scope", "scope"), self._arg(request, "key", "key")
        assert scope is not None and key is not None
        return await self._record_page(request, scope, key, note=SETTLED.get(request.query_params.get("settled", "")))

    async def _record_page(self, request: Request, scope: str, key: str, *, error: str | None = None,
                           note: str | None = None, status: int = 200, draft: str = "") -> Response:
        now, found = await views.record(self.store, scope, key)
        if found is None:
            raise BadInput(f"no record {key!r} in scope {scope!r}", 404)
        frame = self._frame(request, note=note, error=error)
        return HTMLResponse(pages.record_page(frame, now, found, draft=draft), status)

    # -- the action ----------------------------------------------------------------------------------------

    async def settle(self, request: Request) -> Response:
        form = await _form(request)
        origin = f"{request.url.scheme}://{request.headers.get('host', '')}"
        refused = self.gate.action_refused(request.cookies, request.headers, form.get("csrf"), origin)
        if refused is not None:
            return self._message(request, refused, 403)
        scope = _checked(form.get("scope") or "", "scope")
        key = _checked(form.get("key") or "", "key")
        how = form.get("how")
        if how not in SETTLED:
            raise BadInput(f"how must be one of {', '.join(SETTLED)}, got {how!r}")
        kwargs: dict[str, Any] = {"retry": how == "retry", "abandon": how == "abandon"}
        draft = form.get("result") or ""
        if how == "result":
            try:  # as `agentguard resolve --result JSON` reads it
                kwargs["result"] = json.loads(draft)
            except ValueError as exc:
                return await self._record_page(request, scope, key, status=400, draft=draft,
                                               error=f"the result must be JSON: {exc}; nothing was changed")
        if (await views.record(self.store, scope, key))[1] is None:
            raise BadInput(f"no record {key!r} in scope {scope!r}: nothing was changed", 404)
        try:
            await self.guard.resolve(key, scope=scope, **kwargs)
        except GuardError as exc:
            if isinstance(exc, StoreError):
                raise
            return await self._record_page(request, scope, key, status=409, draft=draft,
                                           error=f"{exc}; nothing was changed")
        return RedirectResponse(pages.record_href(scope, key) + f"&settled={how}", 303)


def _checked(value: str, what: str) -> str:
    problem = id_problem(value, what, LIMITS[what])
    if problem is not None:
        raise BadInput(problem)
    return value


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form (what a plain HTML form sends), at most ``MAX_FORM`` bytes; each field once."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise BadInput("an action is a form post (application/x-www-form-urlencoded)", 415)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise BadInput(f"the form is larger than {MAX_FORM} bytes", 413)
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=16)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"the form could not be read: {exc}") from None
    if any(len(v) > 1 for v in fields.values()):
        raise BadInput("a field was given more than once")
    return {k: v[0] for k, v in fields.items()}
