"""Optional dependencies ("extras"): a missing one is reported with the line that installs it.

    require("pydantic_ai", extra="pydantic-ai", by="agentguard.integrations.pydantic_ai")
    # ModuleNotFoundError: agentguard.integrations.pydantic_ai needs the pydantic-ai extra (no module named
    # 'pydantic_ai' is installed): pip install 'agentguard-idempotency[pydantic-ai]'

The check looks modules up without importing them (``importlib.util.find_spec`` on top-level names), so a
module that calls it at import time still imports no framework until one is used.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "agentguard-idempotency"  # the name on the package index (the import package is agentguard)


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra and the pip line."""

    def __init__(self, message: str, *, name: str, extra: str) -> None:
        super().__init__(message, name=name)
        self.extra = extra


def install_line(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'agentguard-idempotency[mcp]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing(*modules: str) -> str | None:
    """The first of the top-level ``modules`` that cannot be found, else None (nothing is imported)."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a blocked import, or a module half-removed from sys.modules
            found = None
        if found is None:
            return module
    return None


def require(*modules: str, extra: str, by: str) -> None:
    """Raise :class:`MissingExtraError` if any of ``modules`` (top-level names) is missing.

    ``extra``: the agentguard extra that installs them; ``by``: what needs them, for the message
    (a module name such as ``agentguard.mcp``, or a phrase such as ``a postgresql+asyncpg:// store``).
    """
    gone = missing(*modules)
    if gone is not None:
        raise MissingExtraError(
            f"{by} needs the {extra} extra (no module named {gone!r} is installed): {install_line(extra)}",
            name=gone,
            extra=extra,
        )
