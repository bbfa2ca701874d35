"""The stripe-python HTTP client behind ``agentguard.downstream.stripe_http_client`` (imported only from there,
when it is called: importing agentguard never imports stripe)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stripe import HTTPClient
from stripe._http_client import new_default_http_client, new_http_client_async_fallback

from ._context import _key

HEADER = "Idempotency-Key"

SDK_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""The key stripe-python makes up for a POST sent without one: a random UUID (12.5 writes ``uuid4()``, 16.1
sixteen random bytes in the same form). Its retries reuse it; a re-run of the tool after a crash would not."""


def stamped(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` with the guard's key in place of one stripe-python made up, inside a guarded call."""
    key = _key.get()
    made_up = headers.get(HEADER)
    if key is None or made_up is None or not SDK_KEY.fullmatch(made_up):
        return headers  # outside a guarded call, no key (a GET), or the caller's own (stripe_options())
    return {**headers, HEADER: key}


class KeyedHTTPClient(HTTPClient):
    """Delegates everything to ``client``; the headers of each call are stamped once, before the client's own
    retry loop, which sends the same headers on every attempt (``max_network_retries``)."""

    def __init__(self, client: HTTPClient | None = None) -> None:
        super().__init__()
        # What StripeClient builds when given no http_client (proxy and certificates are the inner client's).
        self.client = client if client is not None else new_default_http_client(
            async_fallback_client=new_http_client_async_fallback()
        )

    def __getattr__(self, name: str) -> Any:
        if name == "client":
            raise AttributeError(name)  # not set yet (a copy being made): never recurse
        return getattr(self.client, name)  # ``name`` (for the User-Agent) and whatever else a version asks

    def request_with_retries(
        self, method: str, url: str, headers: Mapping[str, str], *args: Any, **kwargs: Any
    ) -> Any:
        return self.client.request_with_retries(method, url, stamped(headers), *args, **kwargs)

    def request_stream_with_retries(
        self, method: str, url: str, headers: Mapping[str, str], *args: Any, **kwargs: Any
    ) -> Any:
        return self.client.request_stream_with_retries(method, url, stamped(headers), *args, **kwargs)

    async def request_with_retries_async(
        self, method: str, url: str, headers: Mapping[str, str], *args: Any, **kwargs: Any
    ) -> Any:
        return await self.client.request_with_retries_async(method, url, stamped(headers), *args, **kwargs)

    async def request_stream_with_retries_async(
        self, method: str, url: str, headers: Mapping[str, str], *args: Any, **kwargs: Any
    ) -> Any:
        return await self.client.request_stream_with_retries_async(method, url, stamped(headers), *args, **kwargs)

    # One attempt, for a caller that goes around the retry loop.
    def request(
        self, method: str, url: str, headers: Mapping[str, str] | None, *args: Any, **kwargs: Any
    ) -> Any:
        return self.client.request(method, url, stamped(headers or {}), *args, **kwargs)

    def request_stream(
        self, method: str, url: str, headers: Mapping[str, str] | None, *args: Any, **kwargs: Any
    ) -> Any:
        return self.client.request_stream(method, url, stamped(headers or {}), *args, **kwargs)

    async def request_async(
        self, method: str, url: str, headers: Mapping[str, str] | None, *args: Any, **kwargs: Any
    ) -> Any:
        return await self.client.request_async(method, url, stamped(headers or {}), *args, **kwargs)

    async def request_stream_async(
        self, method: str, url: str, headers: Mapping[str, str] | None, *args: Any, **kwargs: Any
    ) -> Any:
        return await self.client.request_stream_async(method, url, stamped(headers or {}), *args, **kwargs)

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call,unused-ignore]

    async def close_async(self) -> None:
        await self.client.close_async()  # type: ignore[no-untyped-call,unused-ignore]

    def sleep_async(self, secs: float) -> Any:
        return self.client.sleep_async(secs)
