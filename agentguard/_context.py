"""The task context (``with task(...)``) and the key of the guarded call in progress (``current_key()``).

Both live in contextvars, so they follow asyncio tasks and ``contextvars.copy_context()`` (which agent
frameworks use when they run sync tools in worker threads), and each thread has its own.
"""

from __future__ import annotations

import contextvars
from types import TracebackType
from typing import NamedTuple

from ._errors import GuardError, MissingTaskError
from ._shapes import Shape, shaping

DEFAULT_SCOPE = "default"


class TaskInfo(NamedTuple):  # (a NamedTuple: built on every ``with task(...)``, cheaply)
    task_id: str
    scope: str


_task: contextvars.ContextVar[TaskInfo | None] = contextvars.ContextVar("agentguard_task", default=None)
_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentguard_key", default=None)


MAX_TASK_ID = 1000
MAX_SCOPE = 255  # the scope column is VARCHAR(255) on Postgres
MAX_OPERATION = 255  # a tool's operation name, fixed at decoration


def id_problem(value: object, what: str, limit: int) -> str | None:
    """Why ``value`` cannot be a task id, scope or operation name, or None if it can.

    The one rule for every entry point (``task()``, ``Guard.run``, decoration, the MCP proxy, native MCP tools
    and every adapter): a non-blank ``str`` of at most ``limit`` characters, with no NUL and no lone surrogate,
    so both stores accept exactly the same ids (Postgres text holds neither). Numbers are not converted:
    ``42`` and ``"42"`` would be one task, and a bool or float rendered as text is a mistake, not an id.
    """
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__} {_short(value)}"
    if not value or value.isspace():
        return f"{what} must be a non-blank string, got {value!r}"
    if len(value) > limit:
        return f"{what} is {len(value)} characters long; at most {limit} are allowed"
    if "\x00" in value:
        return f"{what} contains a NUL character, which no store can hold"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return f"{what} contains a lone surrogate (not valid Unicode text): {_short(value)}"
    return None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_id(value: object, what: str, limit: int) -> str:
    """``value`` as a plain str if it follows :func:`id_problem`'s rule, else ValueError saying why."""
    if type(value) is str and 0 < len(value) <= limit and value.isascii() and not value.isspace() \
            and "\x00" not in value:
        return value  # the common case, checked in one pass
    problem = id_problem(value, what, limit)
    if problem is not None:
        raise ValueError(problem)
    return str.__str__(value)  # type: ignore[arg-type,unused-ignore]  # a str subclass as the plain str


def check_task_id(value: object, *, source: str, tool: str | None) -> str:
    """A task id from ``source`` (an argument, a callable, a framework's context) or MissingTaskError
    saying why it is unusable: never silently replaced by another source."""
    problem = id_problem(value, f"the task id from {source}", MAX_TASK_ID)
    if problem is not None:
        target = f" for {tool!r}" if tool else ""
        raise MissingTaskError(f"no usable task id{target}: {problem}; the tool was not run", operation=tool)
    return str.__str__(value)  # type: ignore[arg-type,unused-ignore]


class task:
    """Declare the unit of work that guarded calls belong to.

    Usable as ``with task(...)`` and ``async with task(...)``; nests (the innermost wins).
    """

    __slots__ = ("_info", "_token")

    def __init__(self, task_id: str, *, scope: str = DEFAULT_SCOPE) -> None:
        self._info = TaskInfo(check_id(task_id, "task id", MAX_TASK_ID), check_id(scope, "scope", MAX_SCOPE))
        self._token: contextvars.Token[TaskInfo | None] | None = None

    @property
    def task_id(self) -> str:
        return self._info.task_id

    @property
    def scope(self) -> str:
        return self._info.scope

    def __enter__(self) -> task:
        if self._token is not None:
            raise RuntimeError("this task(...) context is already entered")
        self._token = _task.set(self._info)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._token is not None
        _task.reset(self._token)
        self._token = None

    async def __aenter__(self) -> task:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def current_task() -> TaskInfo | None:
    """The innermost ``task(...)`` in effect, or None."""
    return _task.get()


def current_key(shape: Shape = None) -> str:
    """The downstream key of the innermost guarded call in progress.

    Forward it to the provider (Stripe's ``idempotency_key``, an ``Idempotency-Key`` header). ``shape``
    writes it for a provider that takes shorter keys: ``current_key("square")``, ``current_key(40)`` (see
    ``agentguard.downstream.KeyShape``); by default it is the key as it is, which Stripe and Adyen take.
    """
    key = _key.get()
    if key is None:
        raise GuardError("current_key() was called outside a guarded call")
    if shape is None:
        return key
    shaped = shaping(shape)
    return key if shaped is None else shaped(key)
