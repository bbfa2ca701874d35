"""What the LangChain decorator and middleware share: the LangGraph thread id, the run's config, and refusals
as LangChain's ``ToolException`` (imports LangChain only when they are used)."""

from __future__ import annotations

from typing import Any, NoReturn

from .._errors import GuardError
from ._common import refusal_message

HINT = "there is no LangGraph thread_id in the run's config"


def thread_id(config: Any) -> Any:
    """The LangGraph thread id of a ``RunnableConfig`` (or of the running graph's config), else None."""
    if config is None:
        try:
            from langgraph.config import get_config

            config = get_config()
        except (ImportError, RuntimeError):  # outside a runnable context
            return None
    configurable = (config or {}).get("configurable") or {}
    return configurable.get("thread_id")


def current_config() -> Any:
    try:
        from langgraph.config import get_config

        return get_config()
    except (ImportError, RuntimeError):
        return None


_EXCEPTION: list[type[Exception]] = []


def _exception_class() -> type[Exception]:
    if not _EXCEPTION:
        from langchain_core.tools import ToolException

        class GuardToolException(ToolException):
            """agentguard refused the call; ``str(exc)`` is the text for the model, ``.error`` the GuardError."""

            def __init__(self, error: GuardError) -> None:
                super().__init__(refusal_message(error))
                self.error = error

        GuardToolException.__module__ = "agentguard.integrations.langchain"  # where users import it from
        _EXCEPTION.append(GuardToolException)
    return _EXCEPTION[0]


def refuse(exc: GuardError) -> NoReturn:
    raise _exception_class()(exc) from exc

