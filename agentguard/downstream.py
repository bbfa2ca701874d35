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

    client = stripe.StripeClient(api_key, http_client=downstream.stripe_http_client(), max_network_retries=2)
    client.v1.payment_intents.create(params={...})                                  # the operation's key
    client.v1.refunds.create(params={...}, options=downstream.stripe_options("refund"))   # a sub-key

A provider that takes shorter keys (Square: 45 characters)::

    downstream.install(square_http, shape="square")          # every request's key fits Square
    square.payments.create(..., idempotency_key=downstream.key(shape="square"))
    @guard.once(key="order_id", key_shape="square")          # the injected idempotency_key too

The key is an opaque hash (``ag_`` + 48 hex digits): no personal data, and the same on every attempt and
takeover of the operation. Stripe (keys of up to 255 characters) and Adyen (64) take it as it is; for a
provider with a lower limit — Square's ``idempotency_key`` holds 45 — a shape writes the same digest shorter,
never with fewer than 160 bits (:class:`KeyShape`: ``"square"``, or any limit as an int).
Several foreign calls in one operation each need their own key — a provider rejects one key reused with a
different body — so give each a name: ``key("fee")`` is a sub-key derived from the operation's key, stable
across attempts too, and shaped like the key when asked (``key("fee", shape="square")``).
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from ._context import _key, current_key
from ._extras import require
from ._keys import sub_key
from ._shapes import ADYEN, SHAPES, SQUARE, STRIPE, KeyShape, Shape, key_shape, shape_key, shaping

if TYPE_CHECKING:
    import httpx
    import httpx2
    from stripe import HTTPClient as StripeHTTPClient
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


def key(name: str | None = None, *, shape: Shape = None) -> str:
    """The downstream key of the guarded call in progress, or its sub-key ``name``; written in ``shape`` for
    a provider that takes shorter keys (``"square"``, a maximum length, a :class:`KeyShape`).

    Raises :class:`agentguard.GuardError` outside a guarded call: a money-moving request without a key is
    exactly what this library exists to prevent.
    """
    base = current_key()
    derived = base if name is None else sub_key(base, _check_name(name))
    return derived if shape is None else shape_key(derived, shape)


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


def stamp(
    request: Request, *, header: str = HEADER, methods: Collection[str] = UNSAFE_METHODS, shape: Shape = None
) -> None:
    """Add ``header: <key>`` to ``request`` (an ``httpx.Request`` or an ``httpx2.Request``) if a guarded call is
    in progress and the caller set no key of its own; the key written in ``shape`` if one is given."""
    base = _key.get()
    if base is None or request.method.upper() not in methods:
        return  # outside a guarded call, or a safe method: leave it alone
    if header in request.headers and not request.headers[header].startswith(_SDK_KEY_PREFIXES):
        return  # the caller's own key wins (an SDK's made-up random one does not)
    name = request.extensions.get(NAME_EXTENSION)
    derived = base if name is None else sub_key(base, _check_name(name))
    request.headers[header] = derived if shape is None else shape_key(derived, shape)


def idempotency_hook(request: Request) -> None:
    """A request event hook for ``httpx.Client`` and ``httpx2.Client``."""
    stamp(request)


async def async_idempotency_hook(request: Request) -> None:
    """A request event hook for ``httpx.AsyncClient`` and ``httpx2.AsyncClient``."""
    stamp(request)


# The hooks install() adds: (shape or None for the key as it is, async?) by hook, and the pair by shape's form.
_HOOKS: dict[Any, tuple[KeyShape | None, bool]] = {
    idempotency_hook: (None, False), async_idempotency_hook: (None, True)
}
_PAIRS: dict[tuple[Any, ...], tuple[Any, Any]] = {(): (idempotency_hook, async_idempotency_hook)}


def _hooks(shape: KeyShape | None) -> tuple[Any, Any]:
    """The sync and the async hook that stamp keys of ``shape`` (the same functions for the same form)."""
    form = () if shape is None else (shape.alphabet, shape.prefix, shape.chars)
    pair = _PAIRS.get(form)
    if pair is None:

        def hook(request: Request) -> None:
            stamp(request, shape=shape)

        async def async_hook(request: Request) -> None:
            stamp(request, shape=shape)

        hook.__name__, async_hook.__name__ = "idempotency_hook", "async_idempotency_hook"
        pair = _PAIRS.setdefault(form, (hook, async_hook))
        _HOOKS.setdefault(pair[0], (shape, False))
        _HOOKS.setdefault(pair[1], (shape, True))
    return pair


def _hook_name(hook: Any) -> str:
    shape = _HOOKS[hook][0]
    return f"downstream.{hook.__name__}" + ("" if shape is None else f" (keys shaped {_label(shape)})")


def _label(shape: KeyShape | None) -> str:
    return "as they are" if shape is None else shape.name or f"to at most {shape.max_length} characters"


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


def install(client: HttpClient, *, shape: Shape = None) -> None:
    """Add the right hook to ``client`` (once), keeping its other request hooks.

    ``client`` is an ``httpx`` or ``httpx2`` ``Client`` / ``AsyncClient``. An SDK client (``openai.AsyncOpenAI``,
    ``anthropic.Anthropic``, ...) is not one: build the HTTP client, install the hook on it, and hand it to the
    SDK as ``http_client=``. ``shape``: the provider's key shape (``"square"``, a maximum length, a
    :class:`KeyShape`), for every key the hook adds, sub-keys too; one shape per client.
    """
    shaped = shaping(shape)
    is_async = _is_async_client(client)
    if is_async is None:
        kind = f"{type(client).__module__}.{type(client).__qualname__}"
        raise TypeError(
            f"downstream.install needs an httpx or httpx2 Client or AsyncClient, got {kind}; for an SDK "
            "client, install the hook on the HTTP client you pass to it as http_client="
        )
    sync_hook, async_hook = _hooks(shaped)
    hook: Any = async_hook if is_async else sync_hook
    hooks = client.event_hooks
    for present in (h for h in hooks["request"] if h in _HOOKS and h is not hook):
        present_shape, present_async = _HOOKS[present]
        if present_async != is_async:
            # An async client awaits the sync hook's None and every request fails; a sync client calls the
            # async hook without awaiting it, and no request is stamped: refuse both.
            raise TypeError(
                f"this {type(client).__name__} has {_hook_name(present)} among its request hooks; "
                f"it needs {_hook_name(hook)}: remove the wrong one"
            )
        # Two shapes on one client: the first hook's key would stand, whatever the second was asked for.
        raise TypeError(
            f"this {type(client).__name__} already stamps keys {_label(present_shape)}, not "
            f"{_label(shaped)}: one key shape per client (remove its hook first)"
        )
    if hook not in hooks["request"]:
        hooks["request"] = [*hooks["request"], hook]
        client.event_hooks = hooks


def stripe_http_client(client: StripeHTTPClient | None = None) -> StripeHTTPClient:
    """An HTTP client for ``stripe.StripeClient(..., http_client=...)`` that, inside a guarded call, puts the
    guard's key on each request stripe-python makes, in place of the random one it makes up for a POST
    without ``idempotency_key``, and so on every automatic retry of that request (``max_network_retries``).

    ``client``: the stripe HTTP client to send through (default: the one ``StripeClient`` builds). A key you
    pass yourself is kept — ``stripe_options("fee")``, which each further call in one operation needs —
    unless it has the form of stripe-python's made-up ones (a random UUID). Outside a guarded call nothing
    changes.
    """
    require("stripe", extra="stripe", by="agentguard.downstream.stripe_http_client")
    from ._stripe import KeyedHTTPClient

    return KeyedHTTPClient(client)


__all__ = [
    "ADYEN",
    "HEADER",
    "NAME_EXTENSION",
    "SHAPES",
    "SQUARE",
    "STRIPE",
    "UNSAFE_METHODS",
    "KeyShape",
    "async_idempotency_hook",
    "idempotency_hook",
    "install",
    "key",
    "key_shape",
    "named",
    "shape_key",
    "stamp",
    "stripe_http_client",
    "stripe_options",
]
