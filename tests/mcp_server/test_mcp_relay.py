"""The proxy passes an upstream's whole surface through, with the real ``mcp`` Client, in process, in every
pairing of protocol eras (host, upstream): resources, templates, reads, subscriptions and their updates,
prompts, completions, logging, the list-changed notifications, progress, and the upstream's questions
(elicitation, sampling, roots) to the host and its answers back. The upstream (``full_upstream.py``) logs
every side effect and subscription it sees: the proofs are there as much as in the replies."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import full_upstream
import mcp_types as types
import pytest
from mcp import Client, MCPError

from agentguard.mcp import META_REPLAYED, GuardingProxy, StartupError, parse_config

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
GUARDED = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
KEPT = {"com.example.mcp/kept": "kept", "dev.acme/kept": True}


@pytest.fixture(params=[("legacy", "legacy"), ("legacy", "auto"), ("auto", "legacy"), ("auto", "auto")],
                ids=["host-legacy-up-legacy", "host-legacy-up-2026", "host-2026-up-legacy", "host-2026-up-2026"])
def eras(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(the host's mode, the proxy's mode towards its upstream): the handshake era and 2026-07-28 each way."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "upstream.jsonl"


@pytest.fixture
def proxied(store_url: str, log: Path, eras: tuple[str, str]) -> Callable[..., Any]:
    """``async with proxied(**client_options) as client``: the proxy (started, as the command starts it) in
    front of the full upstream, and a host connected to it."""

    @contextlib.asynccontextmanager
    async def make(tools: str = GUARDED, **options: Any) -> AsyncIterator[Client]:
        host, upstream = eras
        config = parse_config(f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\n'
                              f'mode = "{upstream}"\n\n{tools}')
        proxy = GuardingProxy(config, upstream=full_upstream.build_server(log), environ={})
        async with proxy.started(), Client(proxy.server, mode=host, **options) as client:
            yield client

    return make


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def paid(log: Path) -> list[dict[str, Any]]:
    return full_upstream.events(log, "pay")


async def test_resources_prompts_and_completions_pass_through(proxied: Callable[..., Any]) -> None:
    async with proxied() as client:
        caps, instructions = client.server_capabilities, client.instructions
        resources = await client.list_resources()
        templates = await client.list_resource_templates()
        read = await client.read_resource("memo://a")
        prompts = await client.list_prompts()
        prompt = await client.get_prompt("greet", {"name": "ada"})
        done = await client.complete(types.PromptReference(type="ref/prompt", name="greet"),
                                     {"name": "name", "value": "al"})
    assert caps.resources is not None and caps.prompts is not None and caps.completions is not None
    assert instructions == "Pay with care."  # the upstream's, for the host's model
    assert [str(r.uri) for r in resources.resources] == ["memo://a", "memo://b"]
    assert [t.uri_template for t in templates.resource_templates] == ["memo://{name}"]
    [contents] = read.contents
    assert isinstance(contents, types.TextResourceContents) and contents.text == "contents of memo://a"
    assert [p.name for p in prompts.prompts] == ["greet", "careful"]
    assert [m.content for m in prompt.messages] == [types.TextContent(type="text", text="Hello, ada")]
    assert done.completion.values == ["alice", "albert"]
    # The upstream's reserved _meta keys never come through; its own prefixes do.
    for meta in (resources.resources[0].meta, contents.meta):
        assert meta == KEPT


async def test_the_upstreams_questions_reach_the_host_and_its_answers_go_back(
    proxied: Callable[..., Any], log: Path
) -> None:
    asked: list[str] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"card": "visa-42", "ok": True, "sure": True})

    async def sample(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append("sampling")
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="42"),
                                         model="test-model")

    async def roots(ctx: Any) -> types.ListRootsResult:
        asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri="file:///work")])

    async with proxied(elicitation_callback=elicit, sampling_callback=sample, list_roots_callback=roots) as client:
        card = await client.call_tool("pay_asking", {"order_id": "o-1"})
        model = await client.call_tool("sample", {"prompt": "the answer?"})
        where = await client.call_tool("roots", {})
        secret = await client.read_resource("memo://secret")
        careful = await client.get_prompt("careful", {"name": "ada"})
    assert asked == ["Which card?", "sampling", "roots", "Show the secret?", "Really?"]
    assert text(card) == "paid with visa-42" and [p["card"] for p in paid(log)] == ["visa-42"]
    assert text(model) == "model said: 42" and text(where) == "file:///work"
    assert [c.text for c in secret.contents if isinstance(c, types.TextResourceContents)] == ["the secret"]
    assert careful.messages[0].content == types.TextContent(type="text", text="Hello, ada (accept)")


async def test_a_host_that_cannot_answer_is_never_asked(proxied: Callable[..., Any], log: Path) -> None:
    """A host without the elicitation capability is not sent the upstream's question: the upstream gets an
    error (or, on 2026-07-28, its call ends with one) and nothing is paid."""
    async with proxied() as client:
        res = await client.call_tool("pay_asking", {"order_id": "o-1"})
    assert res.is_error and paid(log) == []


async def test_progress_reaches_the_host_on_the_first_call_and_is_never_replayed(
    proxied: Callable[..., Any], log: Path
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    pay = {"order_id": "o-1", "amount_cents": 5, "task_id": "t-1"}
    async with proxied() as client:
        first = await client.call_tool("pay", pay, progress_callback=progress)
        relayed = list(seen)
        replay = await client.call_tool("pay", pay, progress_callback=progress)
    assert relayed == [(1, 2, "charging"), (2, 2, "charged")]
    assert seen == relayed  # the replay executed nothing, so it reports nothing
    assert first.meta and first.meta[META_REPLAYED] is False and replay.meta and replay.meta[META_REPLAYED] is True
    assert len(paid(log)) == 1


def label(item: Any) -> Any:
    """A change as the handshake era's notification or the 2026-07-28 stream's event, either way."""
    name = type(item).__name__
    if "Updated" in name:
        return ("updated", str(item.uri if hasattr(item, "uri") else item.params.uri))
    return name.removesuffix("Notification").replace("Prompts", "Prompt").replace("Resources", "Resource")


async def test_changes_and_resource_updates_reach_the_host(
    proxied: Callable[..., Any], log: Path, eras: tuple[str, str]
) -> None:
    """A prompt or a resource added upstream is announced to the host; an update of a resource reaches a host
    subscribed to it (the proxy subscribes its upstream to it, and only to it), and no other."""
    got: list[Any] = []
    wanted = {"PromptListChanged", "ResourceListChanged", ("updated", "memo://a")}
    arrived = anyio.Event()

    def note(item: Any) -> None:
        got.append(label(item))
        if wanted <= set(got):
            arrived.set()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            note(message)

    async with proxied(message_handler=on_message) as client, anyio.create_task_group() as tg:
        if eras[0] == "legacy":
            await client.session.send_request(
                types.SubscribeRequest(params=types.SubscribeRequestParams(uri="memo://a")), types.EmptyResult)
        else:
            async def listen(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                async with client.listen(prompts_list_changed=True, resources_list_changed=True,
                                         resource_subscriptions=["memo://a"]) as events:
                    task_status.started()
                    async for event in events:
                        note(event)

            await tg.start(listen)
        for uri in ("memo://b", "memo://a"):  # in this order: an update of b would arrive first
            await client.call_tool("touch", {"uri": uri})
        await client.call_tool("add", {"kind": "prompt", "name": "new"})
        await client.call_tool("add", {"kind": "resource", "name": "memo://c"})
        with anyio.fail_after(10):
            await arrived.wait()
        listed = await client.list_prompts()
        tg.cancel_scope.cancel()
    assert {g for g in got if isinstance(g, tuple)} == {("updated", "memo://a")}
    assert "new" in [p.name for p in listed.prompts]
    subscribed = [e["uri"] for e in full_upstream.events(log, "subscribe")]
    listened = [e["uris"] for e in full_upstream.events(log, "listen") if e["uris"]]
    assert (subscribed, listened) in ((["memo://a"], []), ([], [["memo://a"]])), (subscribed, listened)


async def test_log_lines_reach_the_host_at_its_level(
    proxied: Callable[..., Any], log: Path, eras: tuple[str, str]
) -> None:
    lines: list[types.LoggingMessageNotificationParams] = []

    async def logged(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(params)

    options: dict[str, Any] = {"logging_callback": logged}
    if eras[0] != "legacy":
        options["log_level"] = "warning"  # 2026-07-28: each request opts in
    async with proxied(**options) as client:
        if eras[0] == "legacy":
            await client.session.send_request(types.SetLevelRequest(
                params=types.SetLevelRequestParams(level="warning")), types.EmptyResult)
        await client.call_tool("log", {"level": "info", "message": "chatter"})
        await client.call_tool("log", {"level": "error", "message": "card declined"})
        await client.call_tool("touch", {"uri": "memo://a"})  # a later request: the line has arrived by then
    assert [(p.level, p.data) for p in lines] == [("error", "card declined")]
    if eras[1] != "legacy":  # the one reserved _meta key a request carries on: its log level
        assert {c["meta"].get("io.modelcontextprotocol/logLevel") for c in full_upstream.events(log, "call")} == {
            "warning"}
    else:
        assert [e["level"] for e in full_upstream.events(log, "level")] == (["warning"] if eras[0] == "legacy" else [])


@pytest.mark.parametrize("eras", [("legacy", "legacy")], indirect=True)
async def test_a_change_of_the_hosts_roots_reaches_the_upstream(proxied: Callable[..., Any], log: Path) -> None:
    async def roots(ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[])

    async with proxied(list_roots_callback=roots) as client:
        await client.session.send_notification(types.RootsListChangedNotification())
        with anyio.fail_after(10):
            while not full_upstream.events(log, "roots_changed"):  # noqa: ASYNC110 - the upstream's own log
                await anyio.sleep(0.01)


async def test_guarded_tools_say_they_are_safe_to_retry_and_tasks_are_not_offered(
    proxied: Callable[..., Any], log: Path, eras: tuple[str, str]
) -> None:
    async with proxied() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        refused = await client.call_tool("tasky", {})
    pay = tools["pay"].annotations
    assert pay is not None and pay.idempotent_hint is True
    assert pay.destructive_hint is True and pay.open_world_hint is True and pay.title == "Pay"
    assert tools["pay_asking"].annotations is None
    assert tools["tasky_optional"].execution is None  # offered as an ordinary tool: no host asks for a task
    if eras[1] == "legacy":
        # A tool the upstream runs only as an MCP task (2025-11-25 execution.taskSupport) is not offered, and a
        # call to it is refused.
        assert "tasky" not in tools
        assert refused.is_error and text(refused).endswith("Nothing was executed.") and paid(log) == []
    else:
        # On 2026-07-28 tasks are an extension the proxy's client does not declare: the upstream must answer
        # an ordinary call (this one runs it).
        assert "tasky" in tools and not refused.is_error


async def test_a_guarded_tool_that_only_runs_as_a_task_does_not_start(store_url: str, log: Path) -> None:
    config = parse_config(f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\nmode = "legacy"\n\n'
                          '[tools.tasky]\n')
    proxy = GuardingProxy(config, upstream=full_upstream.build_server(log), environ={})
    with pytest.raises(StartupError) as info:
        async with proxy.started():
            pass
    assert "tools.tasky" in str(info.value) and "only as an MCP task" in str(info.value)


@pytest.mark.parametrize("eras", [("legacy", "legacy")], indirect=True)
async def test_a_call_asking_for_a_task_is_refused(proxied: Callable[..., Any], log: Path) -> None:
    async with proxied() as client:
        with pytest.raises(MCPError, match="not run as MCP tasks"):
            await client.session.send_request(types.CallToolRequest(params=types.CallToolRequestParams(
                name="tasky_optional", task=types.TaskMetadata(ttl=1000))), types.CallToolResult)
    assert paid(log) == []


async def test_reserved_meta_keys_are_stripped_both_ways(proxied: Callable[..., Any], log: Path) -> None:
    """Keys under a reserved prefix (second label ``modelcontextprotocol`` or ``mcp``) belong to one hop:
    neither the host's reach the upstream nor the upstream's the host, stored or not."""
    sent = {"dev.mcp/secret": "x", "org.modelcontextprotocol.api/y": 1, **KEPT}
    tools = f'{GUARDED}\n[tools.stamped]\n'
    async with proxied(tools=tools) as client:
        passed = await client.call_tool("pay_asking", {}, meta=sent)  # unguarded (and refused: no elicitation)
        first = await client.call_tool("stamped", {"task_id": "t"}, meta=sent)
        replay = await client.call_tool("stamped", {"task_id": "t"}, meta=sent)
    for res in (first, replay):
        assert res.meta is not None
        assert {k: v for k, v in res.meta.items() if not k.startswith("dev.agentguard/")} == {
            **KEPT, **({"io.modelcontextprotocol/serverInfo": res.meta["io.modelcontextprotocol/serverInfo"]}
                       if "io.modelcontextprotocol/serverInfo" in res.meta else {})}
        assert res.meta.get("io.modelcontextprotocol/serverInfo", {"name": "agentguard-proxy"})["name"] != "up"
        assert res.content[-1].meta == KEPT
    assert passed.is_error
    for call in full_upstream.events(log, "call"):
        hop = {k for k in call["meta"] if k.startswith("io.modelcontextprotocol/") or k.startswith("progress")}
        assert {k: v for k, v in call["meta"].items() if k not in hop and not k.startswith("dev.agentguard/")} == KEPT
