"""``INJECTED``: the default of a tool's ``Operation`` parameter, so type checkers accept calls without it.

    @guard.once(key=["ride_id"])
    async def book_ride(ride_id: str, op: Operation = INJECTED) -> str: ...

    await book_ride("r-1")          # mypy --strict: fine; agentguard passes the Operation in

A parameter without a default is one every call must pass, as far as a type checker knows; the guard hides
it (``__signature__``) and fills it in, but a checker reads the function's own signature. ``INJECTED`` is
typed as an ``Operation`` for checkers; at run time it is a marker that only says, if the function is ever
called without the guard (``charge.__wrapped__(...)``), that the Operation was not given. The injected key
needs no marker: ``idempotency_key: str = ""``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast

if TYPE_CHECKING:
    from ._operation import Operation


class _Injected:
    """The one marker object (``agentguard.INJECTED``); copies and pickles of it are itself."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "agentguard.INJECTED"

    def __reduce__(self) -> str:
        return "INJECTED"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocols probed with hasattr (copy, pickle, inspect) find nothing here
            raise AttributeError(name)
        raise AttributeError(
            f"agentguard.INJECTED has no {name!r}: it is the default of an Operation parameter, which a guarded "
            "call fills in; this function was called directly, not through guard.once"
        )


# Typed as what it stands for, so `op: Operation = INJECTED` type-checks (an import of Operation here would
# load SQLAlchemy with `import agentguard`).
INJECTED: Final[Operation] = cast("Operation", _Injected())
