"""Forward the guard's downstream key to the provider, so that even a takeover after a crash — which runs the
tool body again — is deduplicated where the money moves.

httpx and httpx2 (a request event hook; adds the header only inside a guarded call, never outside one)::

    client = httpx.Client(event_hooks={"request": [downstream.idempotency_hook]})
    client = httpx.AsyncClient(event_hooks={"request": [downstream.async_idempotency_hook]})
    downstream.install(client)            # the same, picking the right hook for the client
    downstream.install(httpx2_client)     # httpx2.Client / httpx2.AsyncClient alike (openai, anthropic, mcp...)

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

import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from ._context import _key, current_key
from ._keys import sub_key

if TYPE_CHECKING:
    import httpx
    import httpx2
    from stripe import RequestOptions

    Request: TypeAlias = httpx.Request | httpx2.Request
    HttpClient: TypeAlias = httpx.Client | httpx.AsyncClient | httpx2.Client | httpx2.AsyncClient

HEADER = "Idempotency-Key"
"""The header most payment APIs read (Stripe, Adyen, PayPal's ``PayPal-Request-Id`` aside)."""

NAME_EXTENSION = "agentguard.key_name"
"""The httpx/httpx2 request extension that names a sub-key; set it with :func:`named`."""

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_FAMILIES = ("httpx", "httpx2")
"""The HTTP client libraries whose clients :func:`install` knows (httpx2 is httpx's successor, under which the
openai, anthropic, mcp, openai-agents and pydantic-ai packages now run). Their APIs for event hooks,
``Request.headers`` and ``Request.extensions`` are the same."""

_SDK_KEY_PREFIXES = ("stainless-python-retry-",)
"""Idempotency keys an SDK made up itself: the Stainless-generated SDKs (several payment APIs among them) put a
random ``stainless-python-retry-<uuid>`` key on every non-GET request unless the call passed one. It stays the
same across that SDK's own retries only; a re-run of the tool after a crash would send a new one. Inside a
guarded call the guard's key replaces it."""


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
    """httpx/httpx2 ``extensions=`` for one request that should carry the sub-key ``name``."""
    return {NAME_EXTENSION: _check_name(name)}


def stamp(request: Request, *, header: str = HEADER, methods: Collection[str] = UNSAFE_METHODS) -> None:
    """Add ``header: <key>`` to ``request`` (an ``httpx.Request`` or an ``httpx2.Request``) if a guarded call is
    in progress and the caller set no key of its own."""
    base = _key.get()
    if base is None or request.method.upper() not in methods:
        return  # outside a guarded call, or a safe method: leave it alone
    if header in request.headers and not request.headers[header].startswith(_SDK_KEY_PREFIXES):
        return  # the caller's own key wins (an SDK's made-up random one does not)
    name = request.extensions.get(NAME_EXTENSION)
    request.headers[header] = base if name is None else sub_key(base, _check_name(name))


def idempotency_hook(request: Request) -> None:
    """A request event hook for ``httpx.Client`` and ``httpx2.Client``."""
    stamp(request)


async def async_idempotency_hook(request: Request) -> None:
    """A request event hook for ``httpx.AsyncClient`` and ``httpx2.AsyncClient``."""
    stamp(request)


def _is_async_client(client: object) -> bool | None:
    """True/False for an async/sync client of a known family, None for anything else.

    Only families already imported are looked at: a client's class is in ``sys.modules`` before the client can
    exist, so this never imports httpx or httpx2 (either may be absent; ``httpx2.alias_httpx()`` makes them one).
    """
    for family in _FAMILIES:
        module = sys.modules.get(family)
        if module is None:
            continue
        async_client, sync_client = getattr(module, "AsyncClient", None), getattr(module, "Client", None)
        if isinstance(async_client, type) and isinstance(client, async_client):
            return True
        if isinstance(sync_client, type) and isinstance(client, sync_client):
            return False
    return None


def install(client: HttpClient) -> None:
    """Add the right hook to ``client`` (once), keeping its other request hooks.

    ``client`` is an ``httpx`` or ``httpx2`` ``Client`` / ``AsyncClient``. An SDK client (``openai.AsyncOpenAI``,
    ``anthropic.Anthropic``, ...) is not one: build the HTTP client, install the hook on it, and hand it to the
    SDK as ``http_client=``.
    """
    is_async = _is_async_client(client)
    if is_async is None:
        kind = f"{type(client).__module__}.{type(client).__qualname__}"
        raise TypeError(
            f"downstream.install needs an httpx or httpx2 Client or AsyncClient, got {kind}; for an SDK "
            "client, install the hook on the HTTP client you pass to it as http_client="
        )
    hook: Any = async_idempotency_hook if is_async else idempotency_hook
    wrong: Any = idempotency_hook if is_async else async_idempotency_hook
    hooks = client.event_hooks
    if wrong in hooks["request"]:
        # An async client awaits the sync hook's None and every request fails; a sync client calls the async
        # hook without awaiting it, and no request is stamped: refuse both.
        raise TypeError(
            f"this {type(client).__name__} has downstream.{wrong.__name__} among its request hooks; "
            f"it needs downstream.{hook.__name__}: remove the wrong one"
        )
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
