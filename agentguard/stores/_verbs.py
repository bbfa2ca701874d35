"""The hot path's verbs, written once for every executor: each verb's statement (an ``Ask``) or claim plan
(``_claims``), its parameters, and what its answer means.

``SQLStore`` runs them on an event loop (``ClaimStore``'s verbs); :class:`SyncVerbs` runs the same, with the same
parameters, in a sync tool's own thread (the ``Direct`` protocol), over a connection of that thread (a SQLite
file's: ``_direct``; Postgres through psycopg: ``_direct_pg``). An executor only runs statements: none decides.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._claims import CLAIMING, READING, Ask, Claimed, PlanMaker, run
from ._schema import Record, record_from_row
from ._statements import Statements

STORING = "storing the result"
RELEASING = "releasing the claim"


class Asks(NamedTuple):
    """One store's hot statements, as its verbs ask them."""

    read: Ask
    claim: Ask
    take_over: Ask
    renew: Ask
    complete: Ask
    release: Ask
    release_owned: Ask


def asks(sql: Statements) -> Asks:
    return Asks(
        read=Ask(READING, sql.read, writes=False),
        claim=Ask(CLAIMING, sql.claim, claims=True, many=sql.claim_many),
        take_over=Ask("taking over the claim", sql.take_over),
        renew=Ask("renewing the lease", sql.renew, body_ran=True),
        complete=Ask(STORING, sql.complete, body_ran=True, many=sql.complete_many),
        release=Ask(RELEASING, sql.release, body_ran=True),
        release_owned=Ask(RELEASING, sql.release_owned, body_ran=None),
    )


class Plans(NamedTuple):
    """The claim plan for a key likely free, and for one likely taken (``Dialect.plans``)."""

    free: PlanMaker
    taken: PlanMaker


# -- each verb's parameters and answer ----------------------------------------------------------------------


def key_params(scope: str, key: str) -> dict[str, Any]:
    return {"scope": scope, "key": key}


def renew_params(scope: str, key: str, fence: int, lease: float) -> dict[str, Any]:
    return {"scope": scope, "key": key, "fence": fence, "lease": lease}


def complete_params(scope: str, key: str, fence: int, state: str, result: str, retention: float,
                    audit: str | None) -> dict[str, Any]:
    return {"scope": scope, "key": key, "fence": fence, "state": state, "result": result, "retention": retention,
            "audit": audit}


def release_params(scope: str, key: str, fence: int, retention: float, audit: str | None, raised: str | None,
                   bound: bool) -> dict[str, Any]:
    return {"scope": scope, "key": key, "fence": fence, "retention": retention, "audit": audit, "raised": raised,
            "bound": 1 if bound else 0}


def release_owned_params(scope: str, key: str, owner: str, retention: float) -> dict[str, Any]:
    return {"scope": scope, "key": key, "owner": owner, "retention": retention}


def record(scope: str, key: str, row: Any) -> Record | None:
    return None if row is None else record_from_row(scope, key, row)


def took(row: Any) -> tuple[int, int] | None:
    """A takeover's answer: (fence, origin) if we took the claim over."""
    return None if row is None else (int(row[0]), int(row[1]))


# -- in a sync tool's own thread --------------------------------------------------------------------------


class SyncVerbs:
    """The hot verbs in the calling thread (``_protocols.Direct``): the statements and plans ``SQLStore``'s own
    verbs ask, with the same parameters, answered the same. A subclass runs each statement (:meth:`_fetch`, on a
    connection of the calling thread) and raises ``StoreError`` when it fails: the caller may then ask the same
    verb of the store, which runs the same statement with the same parameters (a claim's owner token finds a
    claim whose answer was lost)."""

    def __init__(self, sql: Statements, plans: Plans) -> None:
        self._asks = asks(sql)
        self._plans = plans

    def _fetch(self, ask: Ask, params: dict[str, Any]) -> Any:
        """``ask``'s first row (or None) on this thread's connection; ``StoreError`` if it failed."""
        raise NotImplementedError

    def claim(self, params: dict[str, Any], likely_taken: bool = False) -> Claimed:
        """What ``SQLStore.claim`` answers: our fence, the record there, or None (it vanished)."""
        plan = (self._plans.taken if likely_taken else self._plans.free)(self._asks.read, self._asks.claim, params)
        return run(plan, lambda ask: self._fetch(ask, params))

    def read(self, scope: str, key: str) -> Record | None:
        return record(scope, key, self._fetch(self._asks.read, key_params(scope, key)))

    def take_over(self, params: dict[str, Any]) -> tuple[int, int] | None:
        return took(self._fetch(self._asks.take_over, params))

    def renew(self, scope: str, key: str, fence: int, lease: float) -> bool:
        return self._fetch(self._asks.renew, renew_params(scope, key, fence, lease)) is not None

    def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float,
                 audit: str | None = None) -> bool:
        params = complete_params(scope, key, fence, state, result, retention, audit)
        return self._fetch(self._asks.complete, params) is not None

    def release(self, scope: str, key: str, fence: int, retention: float, audit: str | None = None, *,
                raised: str | None = None, bound: bool = True) -> bool:
        params = release_params(scope, key, fence, retention, audit, raised, bound)
        return self._fetch(self._asks.release, params) is not None

    def release_owned(self, scope: str, key: str, owner: str, retention: float) -> bool:
        params = release_owned_params(scope, key, owner, retention)
        return self._fetch(self._asks.release_owned, params) is not None

    def close(self) -> None:
        raise NotImplementedError
