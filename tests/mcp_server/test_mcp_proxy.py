"""The guarding proxy with the real ``mcp`` Client, in-process (both protocol eras), in front of the payments
demo. Every test counts the charges in the demo's SQLite ledger: the proof is there, not in the replies."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.server import MCPServer, Server, ServerRequestContext
from mcp.server.mcpserver.exceptions import ToolError

from agentguard.mcp import META_KEY, META_REPLAYED, META_TASK_ID, GuardingProxy, parse_config

from conftest import raw_exec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "servers"))
import shifting_upstream  # noqa: E402
from payments_demo import build_server  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
CHARGE = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd"}


def _nested(depth: int) -> Any:
    value: Any = "usd"
    for _ in range(depth):
        value = [value]
    return value


def config_text(store_url: str, tools: str | None = None, extra: str = "") -> str:
    tools = tools if tools is not None else (
        '[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
    )
    return f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\n\n{extra}\n{tools}'


def charges(db: Path) -> list[tuple[str, str | None]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            return conn.execute("SELECT id, idempotency_key FROM charges ORDER BY created").fetchall()
        except sqlite3.OperationalError:  # the demo is still creating its tables
            return []


def touch(path: Path) -> None:
    path.touch()


async def until(check: Callable[[], bool]) -> None:
    """Poll what another thread or process makes true (a ledger row): no event crosses that boundary."""
    while not check():  # noqa: ASYNC110
        await anyio.sleep(0.02)


def charged(ledger: Path) -> Callable[[], bool]:
    return lambda: bool(charges(ledger))


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.fixture(params=["legacy", "auto"])
def mode(request: pytest.FixtureRequest) -> str:
    """Both eras: ``legacy`` is JSON-RPC over memory streams with the initialize handshake (how Codex
    connects); in-process ``auto`` is the 2026-07-28 per-request era (how Claude Code connects)."""
    return str(request.param)


one_era = pytest.mark.parametrize("mode", ["legacy"])


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "payments.db"


@pytest.fixture
def hold(tmp_path: Path) -> Path:
    """The demo holds back the answer to a new charge until this file exists."""
    return tmp_path / "release"


@pytest.fixture
def connect(
    store_url: str, ledger: Path, hold: Path, mode: str
) -> Callable[..., Any]:
    """``async with connect(tools=..., upstream=..., environ=...) as client``: a proxy in front of an upstream."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def make(
        *, tools: str | None = None, extra: str = "", upstream: Any = None, environ: dict[str, str] | None = None,
        held: bool = False,
    ) -> AsyncIterator[Client]:
        if not held:
            touch(hold)
        target = upstream if upstream is not None else build_server(ledger, hold_file=str(hold))
        proxy = GuardingProxy(parse_config(config_text(store_url, tools, extra)), upstream=target,
                              environ=environ or {})
        async with Client(proxy.server, mode=mode) as client:
            yield client

    return make


async def test_repeat_is_replayed_and_labelled(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        first = await client.call_tool("create_charge", {**CHARGE, "task_id": "ticket-1"})
        second = await client.call_tool("create_charge", {**CHARGE, "task_id": "ticket-1"})
    [(charge_id, upstream_key)] = charges(ledger)
    assert not first.is_error and not second.is_error
    assert first.structured_content is not None and first.structured_content["id"] == charge_id
    assert second.structured_content == first.structured_content  # verbatim
    assert first.meta is not None and second.meta is not None
    assert first.meta[META_REPLAYED] is False and second.meta[META_REPLAYED] is True
    # The downstream key reached the upstream as its idempotency_key, and is the same for both calls.
    assert first.meta[META_KEY] == second.meta[META_KEY] == upstream_key
    assert "REPLAY" in text(second) and "Nothing was executed again" in text(second)
    assert second.content[1:] == first.content
    assert "REPLAY" not in text(first)


async def test_five_concurrent_duplicates_make_one_charge(
    connect: Callable[..., Any], ledger: Path, hold: Path
) -> None:
    results: list[types.CallToolResult] = []
    async with connect(held=True) as client:

        async def call() -> None:
            results.append(await client.call_tool("create_charge", {**CHARGE, "task_id": "ticket-5"}))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(call)
            await until(charged(ledger))
            touch(hold)
    [(charge_id, _)] = charges(ledger)
    assert [r.is_error for r in results] == [False] * 5
    assert {r.structured_content["id"] for r in results if r.structured_content} == {charge_id}
    assert sorted(bool(r.meta and r.meta[META_REPLAYED]) for r in results) == [False, True, True, True, True]


async def test_same_order_other_amount_is_refused_and_not_run(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        await client.call_tool("create_charge", {**CHARGE, "task_id": "ticket-2"})
        other = await client.call_tool("create_charge", {**CHARGE, "amount_cents": 5900, "task_id": "ticket-2"})
        assert other.is_error
        assert "amount_cents" in text(other) and "order_id" not in text(other).split("differing:")[1]
        assert "Nothing was executed." in text(other)
        assert len(charges(ledger)) == 1
        # Another order in the same task is another operation.
        new = await client.call_tool("create_charge", {**CHARGE, "order_id": "o-2", "task_id": "ticket-2"})
        assert not new.is_error
    assert len(charges(ledger)) == 2


@pytest.mark.parametrize(
    "arguments",
    [
        {**CHARGE, "order_id": "o-\ud800"},  # a key field (the operation's name)
        {**CHARGE, "currency": "us\udfffd"},  # a fingerprinted argument
        {**CHARGE, "currency": _nested(150)},  # nested past the limit
    ],
    ids=["surrogate-in-key", "surrogate-in-argument", "too-deep"],
)
async def test_arguments_without_a_canonical_form_are_refused_up_front(
    connect: Callable[..., Any], ledger: Path, arguments: dict[str, Any]
) -> None:
    """A model's JSON can carry a lone surrogate (a "\\ud800" escape): refused as nothing executed, never an
    "unexpected failure ... outcome unknown"."""
    async with connect() as client:
        res = await client.call_tool("create_charge", {**arguments, "task_id": "t-1"})
    assert res.is_error and "Nothing was executed." in text(res), text(res)
    assert "unexpected" not in text(res)
    assert charges(ledger) == []


async def test_missing_task_id_is_refused_and_not_run(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        res = await client.call_tool("create_charge", dict(CHARGE))
    assert res.is_error
    assert "task_id" in text(res) and "Nothing was executed." in text(res)
    assert charges(ledger) == []


async def test_task_id_from_meta_then_argument_is_one_operation(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        a = await client.call_tool("create_charge", dict(CHARGE), meta={META_TASK_ID: "run-7"})
        b = await client.call_tool("create_charge", {**CHARGE, "task_id": "run-7"})
    assert len(charges(ledger)) == 1
    assert a.meta and b.meta and b.meta[META_REPLAYED] is True and a.meta[META_KEY] == b.meta[META_KEY]


@one_era
async def test_task_id_from_environment(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect(environ={"AGENTGUARD_TASK_ID": "job-42"}) as client:
        a = await client.call_tool("create_charge", dict(CHARGE))
        b = await client.call_tool("create_charge", dict(CHARGE))
        c = await client.call_tool("create_charge", {**CHARGE, "task_id": "job-43"})  # the argument wins
    assert not a.is_error and b.meta and b.meta[META_REPLAYED] is True
    assert c.meta and c.meta[META_REPLAYED] is False
    assert len(charges(ledger)) == 2


@one_era
async def test_host_call_ids_never_fork_the_key(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        args = {**CHARGE, "task_id": "t"}
        a = await client.call_tool("create_charge", args, meta={"claudecode/toolUseId": "toolu_02"})
        b = await client.call_tool("create_charge", args, meta={"callId": "call_04"})
    assert len(charges(ledger)) == 1 and a.meta and b.meta and b.meta[META_REPLAYED] is True


async def test_tools_list_adds_task_id_and_hides_the_key(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    upstream = {t.name: t for t in await build_server(ledger).list_tools()}
    guarded = tools["create_charge"].input_schema
    assert "task_id" in guarded["required"] and guarded["properties"]["task_id"]["type"] == "string"
    assert "reuse" in guarded["properties"]["task_id"]["description"].lower()
    assert "idempotency_key" not in guarded["properties"]
    # Unguarded tools are relayed untouched.
    for name in ("create_refund", "list_charges"):
        assert tools[name].input_schema == upstream[name].input_schema
        assert tools[name].output_schema == upstream[name].output_schema
        assert tools[name].description == upstream[name].description


async def test_unguarded_tools_pass_through_untouched(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        charge = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
        assert charge.structured_content is not None
        charge_id = charge.structured_content["id"]
        listed = await client.call_tool("list_charges", {})
        # An unguarded tool is not deduplicated: each call reaches the upstream (its own key is honoured).
        r1 = await client.call_tool("create_refund", {"charge_id": charge_id, "amount_cents": 100})
        r2 = await client.call_tool("create_refund", {"charge_id": charge_id, "amount_cents": 100})
        keyed = {"charge_id": charge_id, "idempotency_key": "k", "amount_cents": 1}
        r3 = await client.call_tool("create_refund", keyed)
        r4 = await client.call_tool("create_refund", keyed)
    assert listed.structured_content == {"result": [charge.structured_content]}
    assert listed.meta is None or META_REPLAYED not in listed.meta
    assert r1.structured_content and r2.structured_content and r3.structured_content and r4.structured_content
    assert r1.structured_content["id"] != r2.structured_content["id"]
    assert r3.structured_content["id"] == r4.structured_content["id"]
    with sqlite3.connect(ledger) as conn:
        assert conn.execute("SELECT count(*) FROM refunds").fetchone() == (3,)


async def test_upstream_transport_stamps_are_stripped(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect() as client:
        a = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
        b = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
    for res in (a, b):
        stamp = (res.meta or {}).get("io.modelcontextprotocol/serverInfo")
        assert stamp is None or stamp["name"] == "agentguard-proxy"  # ours, never the upstream's


@one_era
async def test_in_flight_duplicate_with_on_conflict_error(
    connect: Callable[..., Any], ledger: Path, hold: Path
) -> None:
    tools = '[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\non_conflict = "error"\n'
    async with connect(tools=tools, held=True) as client:
        first: list[types.CallToolResult] = []

        async def call() -> None:
            first.append(await client.call_tool("create_charge", {**CHARGE, "task_id": "t"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await until(charged(ledger))
            dup = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
            touch(hold)
        later = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
    assert dup.is_error and "being run" in text(dup)
    assert "Nothing was executed." in text(dup) and "retry" in text(dup).lower()
    assert later.meta and later.meta[META_REPLAYED] is True
    assert later.structured_content == first[0].structured_content
    assert len(charges(ledger)) == 1


async def test_client_timeout_still_records_the_outcome(
    connect: Callable[..., Any], ledger: Path, hold: Path, mode: str
) -> None:
    gave_up = anyio.Event()

    async def release_once_charged() -> None:
        await until(charged(ledger))
        if mode == "legacy":
            await gave_up.wait()  # hold the answer until the client's timeout has fired
        touch(hold)

    async with connect(held=True) as client, anyio.create_task_group() as tg:
        # In-process "auto" dispatch awaits the (shielded) handler directly, so there the timeout can only
        # surface after the answer is released.
        tg.start_soon(release_once_charged)
        with contextlib.suppress(MCPError):  # the client gave up; the handler was cancelled
            await client.call_tool("create_charge", {**CHARGE, "task_id": "t"}, read_timeout_seconds=0.3)
        gave_up.set()
        retry = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
    [(charge_id, _)] = charges(ledger)
    assert retry.structured_content and retry.structured_content["id"] == charge_id
    assert retry.meta and retry.meta[META_REPLAYED] is True  # the cancelled call's outcome was recorded


# -- upstream failures -------------------------------------------------------------------------------------


class Flaky:
    """An upstream whose ``pay`` fails the first ``fail`` times (with ``how``), then succeeds."""

    def __init__(self, fail: int, how: str) -> None:
        self.fail, self.how = fail, how
        self.calls: list[dict[str, Any]] = []

    def server(self) -> Server[Any]:
        async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
            schema = {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "idempotency_key": {"type": "string"}}}
            return types.ListToolsResult(tools=[types.Tool(name="pay", input_schema=schema)])

        async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
            self.calls.append({"args": dict(params.arguments or {}), "meta": dict(ctx.meta or {})})
            if len(self.calls) <= self.fail:
                if self.how == "crash":
                    raise RuntimeError("boom")
                return types.CallToolResult(content=[types.TextContent(type="text", text="card declined")],
                                            is_error=True)
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"paid #{len(self.calls)}")],
                                        structured_content={"n": len(self.calls)})

        return Server("flaky", on_list_tools=list_tools, on_call_tool=call_tool)


@one_era
async def test_error_result_releases_and_retry_uses_the_same_key(connect: Callable[..., Any]) -> None:
    up = Flaky(1, "error")
    tools = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
    async with connect(tools=tools, upstream=up.server()) as client:
        a = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
        b = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
        c = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
    assert a.is_error and "declined" in text(a)
    assert not b.is_error and b.meta and b.meta[META_REPLAYED] is False
    assert c.meta and c.meta[META_REPLAYED] is True and c.structured_content == b.structured_content
    assert len(up.calls) == 2
    keys = {call["args"]["idempotency_key"] for call in up.calls}
    assert keys == {call["meta"][META_KEY] for call in up.calls} and len(keys) == 1


@one_era
async def test_final_error_result_is_replayed(connect: Callable[..., Any]) -> None:
    up = Flaky(1, "error")
    tools = '[tools.pay]\nkey = ["order_id"]\nerrors_final = true\n'
    async with connect(tools=tools, upstream=up.server()) as client:
        a = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
        b = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
    assert a.is_error and b.is_error and len(up.calls) == 1
    assert b.meta and b.meta[META_REPLAYED] is True and "REPLAY" in text(b) and "declined" in text(b)
    assert a.meta and a.meta[META_KEY] == b.meta[META_KEY] == up.calls[0]["meta"][META_KEY]  # replayed with it


@one_era
async def test_unknown_outcome_is_held_without_a_forwarded_key(connect: Callable[..., Any]) -> None:
    up = Flaky(1, "crash")
    async with connect(tools='[tools.pay]\nkey = ["order_id"]\n', upstream=up.server()) as client:
        a = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
        b = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
    assert a.is_error and "unknown" in text(a)
    assert b.is_error and "unknown" in text(b) and "Nothing was executed." in text(b)
    assert len(up.calls) == 1  # never re-run blind: the upstream cannot deduplicate


@one_era
async def test_unknown_outcome_is_retried_with_the_same_key(connect: Callable[..., Any]) -> None:
    up = Flaky(1, "crash")
    tools = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
    async with connect(tools=tools, upstream=up.server()) as client:
        a = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
        b = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
    assert a.is_error and "same idempotency key" in text(a)
    assert not b.is_error and len(up.calls) == 2
    assert up.calls[0]["args"]["idempotency_key"] == up.calls[1]["args"]["idempotency_key"]


async def test_mark_structured_marks_replays_and_the_schema(connect: Callable[..., Any], ledger: Path) -> None:
    tools = ('[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
             'mark_structured = "agentguard_replayed"\n')
    async with connect(tools=tools) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        a = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
        b = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
    schema = listed["create_charge"].output_schema
    assert schema is not None and schema["properties"]["agentguard_replayed"]["type"] == "boolean"
    assert "agentguard_replayed" not in schema.get("required", [])
    assert a.structured_content and "agentguard_replayed" not in a.structured_content
    assert b.structured_content == {**a.structured_content, "agentguard_replayed": True}
    assert len(charges(ledger)) == 1


@one_era
async def test_store_lost_after_startup_fails_closed(connect: Callable[..., Any], ledger: Path, store_url: str) -> None:
    async with connect() as client:
        await raw_exec(store_url, "ALTER TABLE agentguard_calls RENAME TO agentguard_calls_away")
        res = await client.call_tool("create_charge", {**CHARGE, "task_id": "t"})
    assert res.is_error and text(res).endswith("Nothing was executed.")
    assert charges(ledger) == []


@one_era
async def test_native_upstream_error_text_reaches_the_model(connect: Callable[..., Any]) -> None:
    server = MCPServer("strict")

    @server.tool()
    async def pay(order_id: str, idempotency_key: str = "") -> str:
        raise ToolError("insufficient funds")

    tools = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
    async with connect(tools=tools, upstream=server) as client:
        res = await client.call_tool("pay", {"order_id": "o", "task_id": "t"})
    assert res.is_error and "insufficient funds" in text(res)


# -- the task id: one rule, never silently replaced -----------------------------------------------------------

BAD_TASK_IDS = [
    pytest.param(["job-1"], id="list"), pytest.param({"id": "job-1"}, id="dict"), pytest.param(True, id="bool"),
    pytest.param(42, id="int"), pytest.param(4.5, id="float"), pytest.param("", id="empty"),
    pytest.param("   ", id="blank"), pytest.param(None, id="null"),
]


@pytest.mark.parametrize("bad", BAD_TASK_IDS)
async def test_a_bad_task_id_argument_is_refused_not_replaced(
    connect: Callable[..., Any], ledger: Path, bad: object
) -> None:
    # _meta and the environment both name task job-1, which already charged this order: falling back to
    # them would replay job-1's charge as this call's outcome.
    async with connect(environ={"AGENTGUARD_TASK_ID": "job-1"}) as client:
        first = await client.call_tool("create_charge", {**CHARGE, "task_id": "job-1"})
        res = await client.call_tool("create_charge", {**CHARGE, "task_id": bad}, meta={META_TASK_ID: "job-1"})
    assert not first.is_error
    assert res.is_error and text(res).endswith("Nothing was executed.")
    assert "the task id from the task_id argument must be" in text(res)
    assert not (res.meta or {}).get(META_REPLAYED) and res.structured_content is None
    assert len(charges(ledger)) == 1


@pytest.mark.parametrize("bad", [pytest.param(42, id="int"), pytest.param("", id="empty"),
                                 pytest.param(["job-1"], id="list")])
async def test_a_bad_meta_task_id_is_refused_not_replaced(
    connect: Callable[..., Any], ledger: Path, bad: object
) -> None:
    async with connect(environ={"AGENTGUARD_TASK_ID": "job-1"}) as client:
        await client.call_tool("create_charge", {**CHARGE, "task_id": "job-1"})
        res = await client.call_tool("create_charge", dict(CHARGE), meta={META_TASK_ID: bad})
    assert res.is_error and text(res).endswith("Nothing was executed.")
    assert "the task id from _meta['dev.agentguard/task_id'] must be" in text(res)
    assert len(charges(ledger)) == 1


@one_era
async def test_a_blank_environment_task_id_is_refused(connect: Callable[..., Any], ledger: Path) -> None:
    async with connect(environ={"AGENTGUARD_TASK_ID": " "}) as client:
        res = await client.call_tool("create_charge", dict(CHARGE))
    assert res.is_error and "$AGENTGUARD_TASK_ID" in text(res) and text(res).endswith("Nothing was executed.")
    assert charges(ledger) == []


# -- the upstream's tools change under the proxy -------------------------------------------------------------

SHIFTING_TOOLS = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'


@pytest.mark.parametrize("upstream_mode", ["legacy", "auto"])
async def test_a_guarded_tool_the_upstream_changes_is_refused_and_not_listed(
    store_url: str, tmp_path: Path, mode: str, upstream_mode: str
) -> None:
    """The upstream announces that its tools changed (on either era): once ``pay`` is gone, or has lost the
    ``order_id`` the config keys on, a call to it is refused and never passed through unguarded, and
    ``tools/list`` leaves it out; the host is told that the list changed. When the upstream offers ``pay`` as
    configured again, it is guarded again."""
    shape, log = tmp_path / "shape", tmp_path / "log.jsonl"
    shifting_upstream.set_shape(shape, "ok")
    config = parse_config(f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\n'
                          f'mode = "{upstream_mode}"\n\n{SHIFTING_TOOLS}')
    proxy = GuardingProxy(config, upstream=shifting_upstream.build_server(shape, log), environ={})
    notified = anyio.Event()

    async def on_message(message: Any) -> None:
        nonlocal notified
        if isinstance(message, types.ToolListChangedNotification):
            notified.set()

    async def reshape(client: Client, to: str) -> None:
        nonlocal notified
        notified = anyio.Event()
        await client.call_tool("reshape", {"shape": to})
        await notified.wait()  # the proxy has listed the upstream's tools again

    def pay(order: str) -> dict[str, Any]:
        return {"order_id": order, "amount_cents": 100, "task_id": "t"}

    async with Client(proxy.server, mode=mode, message_handler=on_message) as client, \
            anyio.create_task_group() as tg:
        if mode != "legacy":  # the 2026-07-28 era: change notifications come on a listen stream

            async def listen(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                async with client.listen(tools_list_changed=True) as events:
                    task_status.started()
                    async for _ in events:
                        pass

            await tg.start(listen)
        first = await client.call_tool("pay", pay("o-1"))
        for to in ("renamed", "gone"):
            await reshape(client, to)
            refused = await client.call_tool("pay", pay("o-2"))
            assert refused.is_error and text(refused).endswith("Nothing was executed."), text(refused)
            assert "no longer offers it" in text(refused)
            assert "pay" not in {t.name for t in (await client.list_tools()).tools}
        replay = await client.call_tool("pay", pay("o-1"))  # recorded before: still replayed, not re-run
        await reshape(client, "ok")
        listed = {t.name: t for t in (await client.list_tools()).tools}
        again = await client.call_tool("pay", pay("o-2"))
        tg.cancel_scope.cancel()
    assert not first.is_error and not again.is_error and again.meta and again.meta[META_REPLAYED] is False
    assert replay.meta and replay.meta[META_REPLAYED] is True
    assert "task_id" in listed["pay"].input_schema["required"]
    assert [e["args"]["order_id"] for e in shifting_upstream.events(log, "pay")] == ["o-1", "o-2"]
