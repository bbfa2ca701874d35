"""Forward the guard's downstream key to the provider, so that even a takeover after a crash — which runs the
tool body again — is deduplicated where the money moves.

httpx (a request event hook; adds the header only inside a guarded call, never outside one)::

    client = httpx.Client(event_hooks={"request": [downstream.idempotency_hook]})
    client = httpx.AsyncClient(event_hooks={"request": [downstream.async_idempotency_hook]})
    downstream.install(client)            # the same, picking the right hook for the client

    @guard.once(key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict:
        r = client.post("/v1/charges", json={...})                                   # Idempotency-Key: <key>
        f = client.post("/v1/fees", json={...}, extensions=downstream.named("fee"))  # a sub-key, by name
        ...

Stripe (the official ``stripe`` package, ``StripeClient`` API)::

    client.v1.payment_intents.create(params={...}, options=downstream.stripe_options())

The key is an opaque hash (``ag_`` + 48 hex digits): no personal data, well under providers' length limits,
and the same on every attempt of the operation. Several foreign calls in one operation each need their own
key — a provider rejects one key reused with a different body — so give each a name: ``key("fee")`` is a
sub-key derived from the operation's key, stable across attempts too.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, cast

from ._context import _key, current_key
from ._keys import sub_key

if TYPE_CHECKING:
    import httpx
    from stripe import RequestOptions

HEADER = "Idempotency-Key"
"""The header most payment APIs read (Stripe, Adyen, PayPal's ``PayPal-Request-Id`` aside)."""

NAME_EXTENSION = "agentguard.key_name"
"""The httpx request extension that names a sub-key; set it with :func:`named`."""

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def key(name: str | None = None) -> str:
    """The downstream key of the guarded call in progress, or its sub-key ``name``.

    Raises :class:`agentguard.GuardError` outside a guarded call: a money-moving request without a key is
    exactly what this library exists to prevent.
    """
    base = current_key()
    return base if name is None else sub_key(base, _check_name(name))


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a sub-key name must be a non-empty string, got {name!r}")
    return name


def stripe_options(name: str | None = None, **options: Any) -> RequestOptions:
    """``options=`` for a ``StripeClient`` call, with ``idempotency_key`` set to :func:`key`.

    ``client.v1.refunds.create(params={...}, options=stripe_options("refund", stripe_account="acct_1"))``
    """
    return cast("RequestOptions", {**options, "idempotency_key": key(name)})


def named(name: str) -> dict[str, Any]:
    """httpx ``extensions=`` for one request that should carry the sub-key ``name``."""
    return {NAME_EXTENSION: _check_name(name)}


def stamp(request: httpx.Request, *, header: str = HEADER, methods: Collection[str] = UNSAFE_METHODS) -> None:
    """Add ``header: <key>`` to ``request`` if a guarded call is in progress and the caller set none."""
    base = _key.get()
    if base is None or request.method.upper() not in methods or header in request.headers:
        return  # outside a guarded call, a safe method, or the caller's own key: leave it alone
    name = request.extensions.get(NAME_EXTENSION)
    request.headers[header] = base if name is None else sub_key(base, _check_name(name))


def idempotency_hook(request: httpx.Request) -> None:
    """A request event hook for ``httpx.Client``."""
    stamp(request)


async def async_idempotency_hook(request: httpx.Request) -> None:
    """A request event hook for ``httpx.AsyncClient``."""
    stamp(request)


def install(client: httpx.Client | httpx.AsyncClient) -> None:
    """Add the right hook to ``client`` (once), keeping its other request hooks."""
    import httpx

    hook: Any = async_idempotency_hook if isinstance(client, httpx.AsyncClient) else idempotency_hook
    hooks = client.event_hooks
    if hook not in hooks["request"]:
        hooks["request"] = [*hooks["request"], hook]
        client.event_hooks = hooks


__all__ = [
    "HEADER",
    "NAME_EXTENSION",
    "UNSAFE_METHODS",
    "async_idempotency_hook",
    "idempotency_hook",
    "install",
    "key",
    "named",
    "stamp",
    "stripe_options",
]
