"""A sync tool's claim and completion made in its own thread, where the store has them there (a SQLite file:
``stores/_direct.py``), instead of a round trip through the guard's portal loop.

A shortcut beside the general path (``Engine.begin`` and ``Engine.succeed`` on the portal), taking only the
answers that path would take at once, with the engine's own pieces (``claim_params``, ``answered``,
``claimed``, ``encoded``'s codec, ``completed``): a claim won, or a completed record replayed. Anything else —
a record running or released, a failure of the store, a body that ran long enough for its heartbeat to be
renewing, a result that cannot be stored, a claim no longer ours — returns None, and the general path
decides, redoing the statement (a claim by insert, a fenced completion: both harmless to repeat).
``tests/test_direct.py`` proves the two paths equal.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ._calls import Call, Claim, Replay
from ._errors import StoreError
from ._lease import new_owner
from .stores import SUCCEEDED

if TYPE_CHECKING:
    from ._engine import Engine
    from .stores._direct import DirectSQLite


def begin_here(engine: Engine, direct: DirectSQLite, call: Call) -> Claim | Replay | None:
    """The claim in this thread: ours (its heartbeat on the portal's loop), a replay, or None."""
    try:
        got = direct.claim(engine.claim_params(call, new_owner()))
    except StoreError:
        return None
    if isinstance(got, int):
        engine.events.emit("claimed", call, 1)
        return engine.claimed(call, got, 1, got, here=True)
    return None if got is None else engine.answered(call, got)  # (raises on other arguments)


def succeed_here(engine: Engine, direct: DirectSQLite, claim: Claim, value: Any, started: float
                 ) -> tuple[Any] | None:
    """The completion in this thread: (the decoded stored value,), or None."""
    if time.monotonic() - started >= engine.lease / 6:
        return None  # its lease may be being renewed: the general path stops the heartbeat first
    call = claim.call
    try:
        encoded, decoded = call.codec.store(value)
    except (TypeError, ValueError):
        return None
    stored_at = time.monotonic()  # before the database computes expires_at: the cache entry dies first
    try:
        if not direct.complete(call.scope, call.key, claim.fence, SUCCEEDED, encoded, engine.retention,
                               claim.audit()):
            return None
    except StoreError:
        return None
    engine.portal.loop().call_soon_threadsafe(engine.beats.stop, claim)  # (after its start: one queue)
    engine.completed(claim, encoded, stored_at)
    return (decoded,)
