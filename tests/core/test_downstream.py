"""Forwarding the downstream key: the httpx hook and the official stripe client, against a local provider that
deduplicates like Stripe."""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import re
import subprocess
import types
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
import stripe

from agentguard import Guard, GuardError, current_key, downstream, sub_key, task
from tests.conftest import tid
from tests.fake_provider import FakeProvider

pytestmark = pytest.mark.anyio


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture
def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


def echo_client(seen: list[httpx.Request]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    return httpx.Client(base_url="https://provider.test", transport=httpx.MockTransport(handler),
                        event_hooks={"request": [downstream.idempotency_hook]})


async def test_hook_adds_the_key_only_inside_a_guarded_call(guard: Guard) -> None:
    seen: list[httpx.Request] = []
    client = echo_client(seen)

    @guard.once(key="order_id")
    def charge(order_id: str) -> str:
        client.post("/v1/charges", json={"order_id": order_id})
        client.get("/v1/charges")  # a safe method: never stamped
        client.post("/v1/charges", json={}, headers={"Idempotency-Key": "mine"})  # the caller's key wins
        return current_key()

    client.post("/v1/charges", json={})  # outside a guarded call
    with task("t-1"):
        key = charge("o-1")
    assert [r.headers.get("Idempotency-Key") for r in seen] == [None, key, None, "mine"]
    assert key.startswith("ag_") and len(key) <= 255


async def test_sub_keys_by_name_are_distinct_and_stable(guard: Guard) -> None:
    seen: list[httpx.Request] = []
    client = echo_client(seen)
    attempts = [RuntimeError("crashed after both calls")]

    @guard.once(key="order_id")
    def charge(order_id: str) -> str:
        client.post("/v1/charges", json={"order_id": order_id}, extensions=downstream.named("charge"))
        client.post("/v1/fees", json={"order_id": order_id}, extensions=downstream.named("fee"))
        if attempts:
            raise attempts.pop()
        return current_key()

    with task("t-1"):
        with pytest.raises(RuntimeError):
            charge("o-1")
        key = charge("o-1")
    keys = [r.headers["Idempotency-Key"] for r in seen]
    assert keys == [sub_key(key, "charge"), sub_key(key, "fee")] * 2
    assert len(set(keys)) == 2 and key not in keys
    assert downstream.named("fee") == {downstream.NAME_EXTENSION: "fee"}
    with pytest.raises(ValueError, match="non-empty"):
        downstream.named("")


async def test_async_hook_and_install(guard: Guard, provider: FakeProvider) -> None:
    async with httpx.AsyncClient(base_url=provider.url) as client:
        downstream.install(client)
        downstream.install(client)  # once only
        assert client.event_hooks["request"] == [downstream.async_idempotency_hook]

        @guard.once(key="order_id")
        async def charge(order_id: str, amount: int) -> dict[str, Any]:
            r = await client.post("/v1/charges", json={"order_id": order_id, "amount": amount})
            return dict(r.json())

        async with task("t-2"):
            first = await charge("o-1", 500)
            again = await charge("o-1", 500)
    assert first == again and len(provider.charges) == 1
    assert provider.keys() == [(await guard.records())[0].key]


# -- every HTTP client family agent SDKs use: httpx and its successor httpx2, sync and async ---------------------


def recording_client(family: str, is_async: bool, seen: list[Any]) -> Any:
    """A client of ``family`` whose own MockTransport records every request it is sent (no network)."""
    http = importlib.import_module(family)

    def handler(request: Any) -> Any:
        seen.append(request)
        return http.Response(200, json={"ok": True})

    cls = http.AsyncClient if is_async else http.Client
    return cls(base_url="https://provider.test", transport=http.MockTransport(handler))


# (method, path, request options): what a guarded tool sends, in this order
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/charges", {}),  # the operation's key
    ("POST", "/v1/fees", {"extensions": downstream.named("fee")}),  # a sub-key, by name
    ("PUT", "/v1/charges/1", {"headers": {"idempotency-key": "mine"}}),  # the caller's own key wins (any case)
    ("GET", "/v1/charges", {}),  # a safe method: never stamped
    ("DELETE", "/v1/charges/2", {}),  # an unsafe one: stamped
]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("family", ["httpx", "httpx2"])
async def test_install_stamps_both_client_families_sync_and_async(guard: Guard, family: str, is_async: bool) -> None:
    seen: list[Any] = []
    client = recording_client(family, is_async, seen)
    downstream.install(client)
    downstream.install(client)  # once only
    assert client.event_hooks["request"] == [
        downstream.async_idempotency_hook if is_async else downstream.idempotency_hook
    ]

    if is_async:

        @guard.once(key="order_id")
        async def charge(order_id: str) -> str:
            for method, path, options in REQUESTS:
                await client.request(method, path, **options)
            return current_key()

        await client.post("/v1/charges", json={})  # outside a guarded call
        with task(tid()):
            key = await charge("o-1")
        await client.aclose()
    else:

        @guard.once(key="order_id")
        def sync_charge(order_id: str) -> str:
            for method, path, options in REQUESTS:
                client.request(method, path, **options)
            return current_key()

        client.post("/v1/charges", json={})
        with task(tid()):
            key = sync_charge("o-1")
        client.close()

    assert [type(r) for r in seen] == [importlib.import_module(family).Request] * 6
    assert [r.headers.get("Idempotency-Key") for r in seen] == [None, key, sub_key(key, "fee"), "mine", None, key]
    assert key.startswith("ag_")


@pytest.mark.parametrize("family", ["httpx", "httpx2"])
async def test_stamp_works_on_both_request_types(guard: Guard, family: str) -> None:
    http = importlib.import_module(family)
    url = "https://provider.test/v1/charges"

    @guard.once()
    def stamped() -> list[str | None]:
        requests = [
            http.Request("POST", url),
            http.Request("POST", url, extensions=downstream.named("fee")),
            http.Request("PATCH", url, headers={"Idempotency-Key": "mine"}),
            http.Request("GET", url),
        ]
        for request in requests:
            downstream.stamp(request)
        return [current_key(), *(r.headers.get("Idempotency-Key") for r in requests)]

    outside = http.Request("POST", url)
    downstream.stamp(outside)
    assert "Idempotency-Key" not in outside.headers
    with task(tid()):
        key, *headers = stamped()
    assert headers == [key, sub_key(key or "", "fee"), "mine", None]


@pytest.mark.parametrize(
    "thing",
    [
        object(),
        httpx.Request("POST", "https://provider.test"),
        httpx2.Request("POST", "https://provider.test"),
        openai.AsyncOpenAI(api_key="test", base_url="https://provider.test"),  # an SDK client, not an HTTP one
        types.SimpleNamespace(event_hooks={"request": [], "response": []}),  # looks like a client, is not one
    ],
    ids=["object", "httpx.Request", "httpx2.Request", "AsyncOpenAI", "duck"],
)
def test_install_refuses_anything_but_a_client_of_either_family(thing: Any) -> None:
    kind = f"{type(thing).__module__}.{type(thing).__qualname__}"
    with pytest.raises(TypeError, match=re.escape(f"needs an httpx or httpx2 Client or AsyncClient, got {kind};")):
        downstream.install(thing)


@pytest.mark.parametrize("family", ["httpx", "httpx2"])
def test_install_refuses_a_client_holding_the_wrong_flavour_of_hook(family: str) -> None:
    http = importlib.import_module(family)
    client = http.AsyncClient(event_hooks={"request": [downstream.idempotency_hook]})
    wrong = r"has downstream\.idempotency_hook .* needs downstream\.async_idempotency_hook"
    with pytest.raises(TypeError, match=wrong):
        downstream.install(client)
    sync_client = http.Client(event_hooks={"request": [downstream.async_idempotency_hook]})
    with pytest.raises(TypeError, match=r"needs downstream\.idempotency_hook:"):
        downstream.install(sync_client)


def test_install_imports_no_client_family_and_needs_neither(python: str) -> None:
    # sys.modules[name] = None makes `import name` fail as if the package were not installed.
    code = (
        "import sys\n"
        "sys.modules['httpx'] = None\n"
        "import httpx2\n"
        "from agentguard import downstream\n"
        "a, s = httpx2.AsyncClient(), httpx2.Client()\n"
        "downstream.install(a); downstream.install(s)\n"
        "print(a.event_hooks['request'] == [downstream.async_idempotency_hook],\n"
        "      s.event_hooks['request'] == [downstream.idempotency_hook])\n"
        "del sys.modules['httpx']\n"
        "sys.modules['httpx2'] = None\n"
        "import httpx\n"
        "a, s = httpx.AsyncClient(), httpx.Client()\n"
        "downstream.install(a); downstream.install(s)\n"
        "print(a.event_hooks['request'] == [downstream.async_idempotency_hook],\n"
        "      s.event_hooks['request'] == [downstream.idempotency_hook])\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"] * 4
    # httpx2.alias_httpx() makes `import httpx` resolve to httpx2: one family under two names
    code = (
        "import httpx2; httpx2.alias_httpx()\n"
        "import httpx\n"
        "from agentguard import downstream\n"
        "a = httpx.AsyncClient(); downstream.install(a)\n"
        "print(httpx is httpx2, a.event_hooks['request'] == [downstream.async_idempotency_hook])\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def openai_client(is_async: bool, seen: list[httpx2.Request], sdk_key: bool = False) -> Any:
    """The real openai SDK over an httpx2 client carrying the hook. ``sdk_key``: behave like the
    Stainless-generated payment SDKs (same generated base client), which set ``_idempotency_header`` and so
    put a made-up random key on every non-GET request."""
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json={"ok": True})

    http: Any = (httpx2.AsyncClient if is_async else httpx2.Client)(transport=httpx2.MockTransport(handler))
    downstream.install(http)
    sdk: Any = (openai.AsyncOpenAI if is_async else openai.OpenAI)(
        api_key="test", base_url="https://provider.test/v1", http_client=http, max_retries=0
    )
    if sdk_key:
        sdk._idempotency_header = "Idempotency-Key"
    return sdk


@pytest.mark.parametrize("sdk_key", [False, True], ids=["plain", "sdk-made-key"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_an_sdk_client_built_on_httpx2_forwards_the_key(guard: Guard, is_async: bool, sdk_key: bool) -> None:
    seen: list[httpx2.Request] = []
    sdk = openai_client(is_async, seen, sdk_key)

    def calls() -> list[tuple[str, dict[str, Any]]]:
        return [("/charges", {}), ("/fees", {"options": {"idempotency_key": "mine"}})]

    if is_async:

        @guard.once(key="order_id")
        async def charge(order_id: str) -> str:
            for path, extra in calls():
                await sdk.post(path, cast_to=httpx2.Response, body={"order_id": order_id}, **extra)
            return current_key()

        await sdk.post("/charges", cast_to=httpx2.Response, body={})  # outside a guarded call
        with task(tid()):
            key = await charge("o-1")
        await sdk.close()
    else:

        @guard.once(key="order_id")
        def sync_charge(order_id: str) -> str:
            for path, extra in calls():
                sdk.post(path, cast_to=httpx2.Response, body={"order_id": order_id}, **extra)
            return current_key()

        sdk.post("/charges", cast_to=httpx2.Response, body={})
        with task(tid()):
            key = sync_charge("o-1")
        sdk.close()

    outside, inside, own = (r.headers.get("Idempotency-Key") for r in seen)
    if sdk_key:
        assert outside is not None and outside.startswith("stainless-python-retry-")  # the SDK's own, left alone
    else:
        assert outside is None
    assert inside == key  # inside a guarded call the guard's key, also instead of an SDK's made-up one
    # idempotency_key= of a call: the SDK sends it where it has an idempotency header (the caller's key wins);
    # an SDK without one ignores the option, and the hook stamps the guard's key
    assert own == ("mine" if sdk_key else key)


@pytest.fixture
def client(provider: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=provider.url) as client:
        downstream.install(client)
        yield client


async def test_crash_after_the_provider_charged_retry_sends_the_same_key(
    guard: Guard, provider: FakeProvider, client: httpx.Client
) -> None:
    crashes = [ConnectionError("response lost after the charge")]
    runs = 0

    @guard.once(key="order_id")
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        r = client.post("/v1/charges", json={"order_id": order_id, "amount": amount})
        if crashes:
            raise crashes.pop()
        return dict(r.json())

    with task("t-3"):
        with pytest.raises(ConnectionError):
            charge("o-1", 500)
        receipt = charge("o-1", 500)  # the claim was released: the body runs again, with the same key
        assert charge("o-1", 500) == receipt  # and then it is replayed by the guard
    assert runs == 2
    assert len(provider.charges) == 1 and receipt["id"] == provider.charges[0]["id"]
    keys = provider.keys("/v1/charges")
    assert len(keys) == 2 and len(set(keys)) == 1
    assert [r.replayed for r in provider.requests] == [False, True]


def stripe_client(provider: FakeProvider) -> stripe.StripeClient:
    return stripe.StripeClient("sk_test_fake", base_addresses={"api": provider.url}, max_network_retries=0)


async def test_official_stripe_client_gets_the_key_and_deduplicates_a_retry(
    guard: Guard, provider: FakeProvider
) -> None:
    client = stripe_client(provider)
    crashes = [TimeoutError("read timed out after Stripe charged")]

    @guard.once(key="order_id")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        intent = client.v1.payment_intents.create(
            params={"amount": amount_cents, "currency": "usd", "metadata": {"order_id": order_id}},
            options=downstream.stripe_options(),
        )
        if crashes:
            raise crashes.pop()
        return {"payment_intent": intent.id, "status": intent.status}

    with task("ticket-8812"):
        with pytest.raises(TimeoutError):
            charge("o-1", 4900)
        receipt = charge("o-1", 4900)
        assert charge("o-1", 4900) == receipt
    assert len(provider.charges) == 1 and receipt == {"payment_intent": "pi_000001", "status": "succeeded"}
    (record,) = await guard.records()
    assert provider.keys("/v1/payment_intents") == [record.key, record.key]
    assert provider.requests[1].replayed


async def test_stripe_rejects_a_reused_key_with_other_params(guard: Guard, provider: FakeProvider) -> None:
    # Why several foreign calls in one operation need sub-keys: one key, two bodies, and Stripe refuses.
    client = stripe_client(provider)

    @guard.once(key="order_id")
    def charge_and_fee(order_id: str, use_sub_keys: bool) -> list[str]:
        ids = []
        for name, amount in (("charge", 4900), ("fee", 100)):
            options = downstream.stripe_options(name if use_sub_keys else None)
            intent = client.v1.payment_intents.create(params={"amount": amount, "currency": "usd"}, options=options)
            ids.append(intent.id)
        return ids

    with task("t-a"), pytest.raises(stripe.IdempotencyError):
        charge_and_fee("o-1", False)
    with task("t-b"):
        assert charge_and_fee("o-2", True) == ["pi_000002", "pi_000003"]


async def test_stripe_options_outside_a_guarded_call_refuses() -> None:
    with pytest.raises(GuardError, match="outside a guarded call"):
        downstream.stripe_options()
    with pytest.raises(GuardError):
        downstream.key("fee")


def test_importing_agentguard_and_its_adapters_imports_no_framework(python: str) -> None:
    code = (
        "import sys, agentguard, agentguard.downstream, agentguard.integrations\n"
        "import agentguard.integrations.pydantic_ai, agentguard.integrations.openai_agents\n"
        "import agentguard.integrations.langchain, agentguard.integrations.dbos, agentguard.integrations.temporal\n"
        "import agentguard.integrations.smolagents, agentguard.integrations.llamaindex, agentguard.integrations.agno\n"
        "import agentguard.integrations.google_adk, agentguard.integrations.ag2\n"
        "import agentguard.integrations.claude_agent_sdk, agentguard.integrations.anthropic\n"
        "heavy = {'pydantic_ai', 'agents', 'langchain', 'langchain_core', 'langgraph', 'dbos', 'temporalio',\n"
        "         'httpx', 'httpx2', 'stripe', 'mcp', 'smolagents', 'llama_index', 'workflows', 'agno',\n"
        "         'ag2', 'claude_agent_sdk', 'anthropic', 'google.adk'}\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "loaded |= {'google.adk' for m in sys.modules if m.startswith('google.adk')}  # google is a namespace\n"
        "print(sorted(heavy & loaded))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# -- key shapes on the httpx hook ----------------------------------------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("family", ["httpx", "httpx2"])
async def test_install_with_a_shape_stamps_keys_the_provider_takes(guard: Guard, family: str, is_async: bool) -> None:
    seen: list[Any] = []
    client = recording_client(family, is_async, seen)
    downstream.install(client, shape="square")
    downstream.install(client, shape=45)  # the same shape: once only
    assert len(client.event_hooks["request"]) == 1
    with pytest.raises(TypeError, match=r"already stamps keys square, not as they are: one key shape per client"):
        downstream.install(client)

    if is_async:

        @guard.once(key="order_id")
        async def charge(order_id: str) -> str:
            for method, path, options in REQUESTS:
                await client.request(method, path, **options)
            return current_key()

        with task(tid()):
            key = await charge("o-1")
        await client.aclose()
    else:

        @guard.once(key="order_id")
        def sync_charge(order_id: str) -> str:
            for method, path, options in REQUESTS:
                client.request(method, path, **options)
            return current_key()

        with task(tid()):
            key = sync_charge("o-1")
        client.close()

    square = [downstream.shape_key(key, "square"), downstream.shape_key(sub_key(key, "fee"), "square")]
    assert [r.headers.get("Idempotency-Key") for r in seen] == [square[0], square[1], "mine", None, square[0]]
    assert all(len(k) <= 45 for k in square)


@pytest.mark.parametrize("family", ["httpx", "httpx2"])
def test_install_refuses_the_wrong_flavour_of_a_shaped_hook(family: str) -> None:
    http = importlib.import_module(family)
    client = http.AsyncClient()
    downstream.install(client, shape="square")
    sync_client = http.Client(event_hooks={"request": client.event_hooks["request"]})
    with pytest.raises(TypeError, match=r"has downstream\.async_idempotency_hook \(keys shaped square\) among its "
                                        r"request hooks; it needs downstream\.idempotency_hook \(keys shaped square\)"):
        downstream.install(sync_client, shape="square")
    with pytest.raises(ValueError, match="did you mean 'square'"):
        downstream.install(client, shape="squar")


# -- stripe-python's own client, its automatic retries included -------------------------------------------------


class FlakyStripeHTTP(stripe.HTTPClient):
    """A stripe HTTP client that answers from memory and fails every other attempt in a way stripe-python
    retries (a dropped connection, or a 503 asking for a retry): each call needs the SDK's own retry."""

    name = "flaky"

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail
        self.sent: list[tuple[str, str, dict[str, str]]] = []

    def _sleep_time_seconds(self, num_retries: int, *args: Any) -> float:
        return 0.0  # the SDK's backoff between retries: not what is tested

    def sleep_async(self, secs: float) -> Any:
        return asyncio.sleep(0)

    def request(self, method: str, url: str, headers: Any, post_data: Any = None, **kwargs: Any) -> Any:
        self.sent.append((method, url, dict(headers or {})))
        if len(self.sent) % 2:
            if self.fail == "connection":
                raise stripe.APIConnectionError("connection reset by peer", should_retry=True)
            return json.dumps({"error": {"message": "try again"}}), 503, {"stripe-should-retry": "true"}
        body = {"id": f"pi_{len(self.sent)}", "object": "payment_intent", "status": "succeeded"}
        return json.dumps(body), 200, {"request-id": f"req_{len(self.sent)}"}

    async def request_async(self, method: str, url: str, headers: Any, post_data: Any = None, **kwargs: Any) -> Any:
        return self.request(method, url, headers, post_data)

    def close(self) -> None:
        pass

    async def close_async(self) -> None:
        pass

    def keys(self) -> list[str | None]:
        return [headers.get("Idempotency-Key") for _, _, headers in self.sent]


def sdk_client(http: stripe.HTTPClient) -> stripe.StripeClient:
    return stripe.StripeClient("sk_test_fake", http_client=http, max_network_retries=2)


@pytest.mark.parametrize("fail", ["connection", "503"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_every_request_stripe_python_sends_and_retries_carries_the_guards_key(
    guard: Guard, fail: str, is_async: bool
) -> None:
    """Through ``stripe_http_client()``, a ``StripeClient`` call without ``idempotency_key`` carries the guard's
    key, not the random one stripe-python makes up, on its first attempt and on the SDK's own retry; a re-run
    of the body (its claim released) sends it again; a key passed with ``stripe_options`` is kept."""
    http = FlakyStripeHTTP(fail)
    client = sdk_client(downstream.stripe_http_client(http))
    crashes = [ConnectionError("the answer was lost after Stripe charged")]
    params: dict[str, Any] = {"amount": 4900, "currency": "usd"}

    if is_async:

        @guard.once(key="order_id")
        async def charge(order_id: str) -> str:
            await client.v1.payment_intents.create_async(params=params)
            await client.v1.payment_intents.create_async(params=params, options=downstream.stripe_options("fee"))
            await client.v1.payment_intents.retrieve_async("pi_1")  # a GET: no key
            if crashes:
                raise crashes.pop()
            return current_key()

        await client.v1.payment_intents.create_async(params=params)  # outside a guarded call
        with task(tid()):
            with pytest.raises(ConnectionError):
                await charge("o-1")
            key = await charge("o-1")
    else:

        @guard.once(key="order_id")
        def sync_charge(order_id: str) -> str:
            client.v1.payment_intents.create(params=params)
            client.v1.payment_intents.create(params=params, options=downstream.stripe_options("fee"))
            client.v1.payment_intents.retrieve("pi_1")
            if crashes:
                raise crashes.pop()
            return current_key()

        client.v1.payment_intents.create(params=params)
        with task(tid()):
            with pytest.raises(ConnectionError):
                sync_charge("o-1")
            key = sync_charge("o-1")

    (record,) = await guard.records()
    assert key == record.key
    outside, *inside = http.keys()
    # outside a guarded call the SDK's own key is left alone (and kept across its retry)
    assert outside is not None and re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", outside)
    assert http.keys()[1] == outside
    inside = inside[1:]
    # two runs of the body x (charge, fee, retrieve), each sent twice (the failed attempt and the SDK's retry)
    one_run = [key, key, sub_key(key, "fee"), sub_key(key, "fee"), None, None]
    assert inside == one_run * 2
    assert [method for method, _, _ in http.sent] == ["post"] * 2 + (["post"] * 4 + ["get"] * 2) * 2


async def test_stripe_options_alone_carries_the_key_through_the_sdks_retries(guard: Guard) -> None:
    http = FlakyStripeHTTP("connection")
    client = sdk_client(http)  # no stripe_http_client: every call passes its key itself

    @guard.once(key="order_id")
    def charge(order_id: str) -> str:
        client.v1.payment_intents.create(params={"amount": 1, "currency": "usd"}, options=downstream.stripe_options())
        return current_key()

    with task(tid()):
        key = charge("o-1")
    assert http.keys() == [key, key]


def test_stripe_http_client_delegates_to_the_client_it_wraps_and_builds_stripes_default() -> None:
    http = FlakyStripeHTTP("connection")
    wrapped = downstream.stripe_http_client(http)
    assert isinstance(wrapped, stripe.HTTPClient) and wrapped.name == "flaky"
    default = downstream.stripe_http_client()
    assert isinstance(default, stripe.HTTPClient) and default.name == stripe.new_default_http_client().name
    copy.copy(wrapped)  # (a copy being made never recurses into the wrapped client)
