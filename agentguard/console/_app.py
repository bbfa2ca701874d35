"""The console's web application (Starlette): four pages and one action.

    GET  /                      the held outcomes, then a page of the tasks (latest claim first), searched by
                                task id (or its start), key (or its start), operation (its start), scope, state
    GET  /task?scope=S&id=T     a page of a task's operations: their timeline (SVG), their attempts, their records
    GET  /record?scope=S&key=K  one record: its steps, its values (to the token's holder), its attempts, and the
                                settle forms, which carry the revision the page shows
    POST /settle                settle a held operation: exactly ``Guard.resolve``, as ``agentguard resolve``,
                                on the revision the person saw (``stores/_decisions``)

A list longer than a page comes a page at a time (``?page=N``), with how long it is. Any page opened with
``?token=...`` signs the browser in (a cookie) and redirects to itself without it. The action is refused (403)
without the token's cookie and the form's anti-forgery field (``_auth``). Bad input (malformed JSON, an unknown
key, a key no longer held, a record that changed since the page was read) is answered with a page that says
what was wrong, and nothing is changed in the store; the same decision sent twice is made once.
"""

from __future__ import annotations

import asyncio
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
from .._errors import GuardError, RecordChangedError, StoreError
from .._guard import Guard
from .._redact import redact_text
from ..stores import Attempt, SQLStore
from ..stores import _console as views
from ..stores import _prefixes as prefixes
from ..stores._attempts import DROPPED
from . import _pages as pages
from ._auth import Gate
from ._timeline import rows_of_attempts, svg

MAX_FORM = 1 << 20  # bytes: a step's result is a provider's answer, not a file
SETTLED = {
    "result": "the step's result was recorded: the next call of this operation goes on from there",
    "retry": "the step was cleared: the next call of this operation runs it again, with the same sub-key",
    "abandon": "the operation was abandoned: every later call of it errors",
    "again": "already applied: this decision had been made (sent twice, or by someone else); nothing was changed",
}
PER_PAGE = 100  # tasks on a page of the list; operations on a page of a task
HELD_SHOWN = 20  # held outcomes at the top of the list (all of them: the tasks with ?state=held)
KEYS_SHOWN = 100  # records listed for a key's start that several keys have
MAX_ATTEMPTS = 1000  # ledger entries of a task of one page, or of one record
PER_OPERATION = 20  # ledger entries of each operation, on a page of a task of several pages
MAX_PAGE = 10**7
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

    def _page(self, request: Request) -> int:
        """The page asked for (``page=N``, from 1)."""
        text = request.query_params.get("page") or "1"
        if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
            raise BadInput(f"page must be a whole number from 1 to {MAX_PAGE}, got {text[:20]!r}")
        return int(text)

    # -- pages -------------------------------------------------------------------------------------------

    async def tasks(self, request: Request) -> Response:
        scope = self._arg(request, "scope", "scope", required=False)
        state = request.query_params.get("state") or None
        if state is not None and state not in views.STATES:
            raise BadInput(f"state must be one of {', '.join(views.STATES)}, got {state!r}")
        operation = self._arg(request, "operation", "operation", required=False)
        task = self._arg(request, "task", "task", required=False)
        key = self._arg(request, "key", "key", required=False)
        number = self._page(request)
        filters = {k: v for k, v in (("task", task), ("key", key), ("operation", operation), ("scope", scope),
                                     ("state", state)) if v}

        async def held() -> views.Page[views.HeldRow] | None:
            # the held outcomes head the first page (a scan of the records: not again on every later one)
            return await views.held(self.store, scope=scope, limit=HELD_SHOWN) if number == 1 else None

        if key is not None:  # a key, or its start (as `agentguard show` takes it)
            found = await prefixes.keys(self.store, key, scope=scope, limit=KEYS_SHOWN + 1)
            if len(found) == 1:
                return RedirectResponse(pages.record_href(found[0][1], found[0][0]), 303)
            return HTMLResponse(pages.tasks_page(self._frame(request), views.Page(0.0, 0, 0, []), await held(),
                                                 filters, PER_PAGE, found=found, shown=KEYS_SHOWN))
        # (two reads at once, each on a connection of its own: the page waits for the longer, not for both)
        listing, shown = await asyncio.gather(
            views.tasks(self.store, scope=scope, state=state, operation=operation, task=task,
                        offset=(number - 1) * PER_PAGE, limit=PER_PAGE),
            held())
        return HTMLResponse(pages.tasks_page(self._frame(request), listing, shown, filters, PER_PAGE))

    async def task(self, request: Request) -> Response:
        scope, task_id = self._arg(request, "scope", "scope"), self._arg(request, "id", "task")
        assert scope is not None and task_id is not None
        number = self._page(request)
        records = await views.task(self.store, scope, task_id, offset=(number - 1) * PER_PAGE, limit=PER_PAGE)
        attempts, note = await self._attempts_of(scope, task_id, records)
        if not records.rows and not attempts and number == 1:
            raise BadInput(f"no records or attempts of task {task_id!r} in scope {scope!r}", 404)
        rows = rows_of_attempts(records.rows, attempts, records.now, lambda key: pages.record_href(scope, key))
        picture = svg(rows, title=f"timeline of task {task_id}")
        return HTMLResponse(pages.task_page(self._frame(request), scope, task_id, records, PER_PAGE, picture,
                                            attempts, note))

    async def _attempts_of(self, scope: str, task_id: str,
                           records: views.Page[views.RecordRow]) -> tuple[list[Attempt], str]:
        """The ledger's entries of the operations on this page of a task, in the order they happened, and what
        the page says of them. A task of one page: all of the task's (an operation forgotten or swept keeps its
        attempts), read at once; a longer one: each operation's on the page, read through its key."""
        if records.offset == 0 and records.total <= len(records.rows):
            found = await self.guard.attempts(task_id=task_id, scope=scope, limit=MAX_ATTEMPTS + 1)
            entries = [a for a in found[:MAX_ATTEMPTS] if a.kind != DROPPED]
            if len(found) > MAX_ATTEMPTS:
                return entries, (f"The first {MAX_ATTEMPTS} entries of the task in the ledger; "
                                 f"`agentguard timeline {task_id}` prints them all.")
            return entries, "Every entry of the task in the ledger, in the order they happened."
        each = await asyncio.gather(*(self.guard.attempts(key=r.key, scope=scope, limit=PER_OPERATION + 1)
                                      for r in records.rows))
        cut = sum(len(found) > PER_OPERATION for found in each)
        entries = sorted((a for found in each for a in found[:PER_OPERATION] if a.kind != DROPPED),
                         key=lambda a: (a.at, a.id))
        note = "The entries in the ledger of the operations on this page, in the order they happened"
        if cut:
            note += (f"; of {cut} operation(s), only the first {PER_OPERATION}: their record's page shows "
                     f"up to {MAX_ATTEMPTS}")
        return entries, note + "."

    async def record(self, request: Request) -> Response:
        scope, key = self._arg(request, "scope", "scope"), self._arg(request, "key", "key")
        assert scope is not None and key is not None
        return await self._record_page(request, scope, key, note=SETTLED.get(request.query_params.get("settled", "")))

    async def _record_page(self, request: Request, scope: str, key: str, *, error: str | None = None,
                           note: str | None = None, status: int = 200, draft: str = "") -> Response:
        now, found = await views.record(self.store, scope, key)
        if found is None:
            raise BadInput(f"no record {key!r} in scope {scope!r}", 404)
        entries = await self.guard.attempts(key=key, scope=scope, limit=MAX_ATTEMPTS + 1)
        said = (f"The first {MAX_ATTEMPTS} of its entries in the ledger; `agentguard show {key}` prints them all."
                if len(entries) > MAX_ATTEMPTS else "")
        frame = self._frame(request, note=note, error=error)
        return HTMLResponse(pages.record_page(frame, now, found, [a for a in entries[:MAX_ATTEMPTS]
                                                                  if a.kind != DROPPED], said, draft=draft), status)

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
        if how not in ("result", "retry", "abandon"):
            raise BadInput(f"how must be one of result, retry, abandon, got {how!r}")
        revision = form.get("revision") or ""
        if not revision:
            raise BadInput("the form lacks the record's revision (the revision its page showed): reload the page")
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
            done = await self.guard.resolve(key, scope=scope, revision=revision, **kwargs)
        except ValueError as exc:  # a revision that is not one
            raise BadInput(f"{exc}; nothing was changed") from None
        except GuardError as exc:
            if isinstance(exc, StoreError):
                raise
            if isinstance(exc, RecordChangedError) and exc.revision is None:
                raise BadInput(f"{exc}", 409) from None
            return await self._record_page(request, scope, key, status=409, draft=draft,
                                           error=str(exc) if isinstance(exc, RecordChangedError)
                                           else f"{exc}; nothing was changed")
        said = "again" if done.startswith("already applied") else how
        return RedirectResponse(pages.record_href(scope, key) + f"&settled={said}", 303)


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
