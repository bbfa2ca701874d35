"""The task context (``with task(...)``) and the key of the guarded call in progress (``current_key()``).

Both live in contextvars, so they follow asyncio tasks and ``contextvars.copy_context()`` (which agent
frameworks use when they run sync tools in worker threads), and each thread has its own.
"""

from __future__ import annotations

import contextvars
from types import TracebackType
from typing import NamedTuple

from ._errors import GuardError

DEFAULT_SCOPE = "default"


class TaskInfo(NamedTuple):  # (a NamedTuple: built on every ``with task(...)``, cheaply)
    task_id: str
    scope: str


_task: contextvars.ContextVar[TaskInfo | None] = contextvars.ContextVar("agentguard_task", default=None)
_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentguard_key", default=None)


def _check_id(value: object, what: str) -> str:
    if type(value) is str and 0 < len(value) <= 1000 and not value.isspace():
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > 1000:
        raise ValueError(f"{what} is longer than 1000 characters")
    return value


class task:
    """Declare the unit of work that guarded calls belong to.

    Usable as ``with task(...)`` and ``async with task(...)``; nests (the innermost wins).
    """

    __slots__ = ("_info", "_token")

    def __init__(self, task_id: str, *, scope: str = DEFAULT_SCOPE) -> None:
        self._info = TaskInfo(_check_id(task_id, "task id"), _check_id(scope, "scope"))
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


def current_key() -> str:
    """The downstream key of the innermost guarded call in progress.

    Forward it to the provider (Stripe's ``idempotency_key``, an ``Idempotency-Key`` header).
    """
    key = _key.get()
    if key is None:
        raise GuardError("current_key() was called outside a guarded call")
    return key
