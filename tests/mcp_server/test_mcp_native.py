"""Guarded native ``MCPServer`` tools (``agentguard.mcp.guarded_tool``), in-process in both eras, and the
payments demo's Stripe-like behaviour on ``idempotency_key``."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import mcp_types as types
import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.server.mcpserver import Context

from agentguard import Guard, task
from agentguard.mcp import META_KEY, META_REPLAYED, META_TASK_ID, guarded_tool

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "servers"))
from guarded_payments import build_server  # noqa: E402
from payments_demo import IdempotencyError, Ledger  # noqa: E402

pytestmark = pytest.mark.storeless  # the MCP layer, not the store's SQL: runs once

CHARGE = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd"}


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM charges").fetchone()[0])


@pytest.fixture(params=["legacy", "auto"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def guard(make_guard: Callable[..., Guard]) -> Guard:
    return make_guard()


@pytest.fixture
async def client(guard: Guard, tmp_path: Path, mode: str) -> AsyncIterator[Client]:
    async with Client(build_server(guard, Ledger(tmp_path / "payments.db")), mode=mode) as c:
        yield c


@pytest.mark.anyio
async def test_schema_requires_task_id_and_hides_the_key(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    schema = tools["create_charge"].input_schema
    assert "task_id" in schema["required"] and "idempotency_key" not in schema["properties"]
    assert "reuse" in schema["properties"]["task_id"]["description"].lower()
    assert tools["create_charge"].output_schema is not None  # structured output survives the wrapper
    assert "task_id" not in tools["list_charges"].input_schema.get("properties", {})
    hints = tools["create_charge"].annotations  # a guarded tool says it is safe to repeat
    assert hints is not None and hints.idempotent_hint is True


@pytest.mark.anyio
async def test_repeat_replays_once_charged(client: Client, tmp_path: Path) -> None:
    first = await client.call_tool("create_charge", {**CHARGE, "task_id": "t-1"})
    second = await client.call_tool("create_charge", {**CHARGE, "task_id": "t-1"})
    assert count(tmp_path / "payments.db") == 1
    assert not first.is_error and second.structured_content == first.structured_content
    assert first.meta and first.meta[META_REPLAYED] is False and second.meta and second.meta[META_REPLAYED] is True
    assert "REPLAY" in text(second) and "REPLAY" not in text(first)
    with sqlite3.connect(tmp_path / "payments.db") as conn:
        assert conn.execute("SELECT idempotency_key FROM charges").fetchone()[0] == first.meta[META_KEY]


@pytest.mark.anyio
async def test_refusals_say_nothing_was_executed(client: Client, tmp_path: Path) -> None:
    missing = await client.call_tool("create_charge", dict(CHARGE))
    assert missing.is_error and "task_id" in text(missing) and "Nothing was executed." in text(missing)
    await client.call_tool("create_charge", {**CHARGE, "task_id": "t-2"})
    other = await client.call_tool("create_charge", {**CHARGE, "amount_cents": 1, "task_id": "t-2"})
    assert other.is_error and "amount_cents" in text(other) and "Nothing was executed." in text(other)
    assert count(tmp_path / "payments.db") == 1


@pytest.mark.anyio
async def test_task_id_from_meta(client: Client, tmp_path: Path) -> None:
    a = await client.call_tool("create_charge", dict(CHARGE), meta={META_TASK_ID: "run-9"})
    b = await client.call_tool("create_charge", {**CHARGE, "task_id": "run-9"})
    assert not a.is_error and b.meta and b.meta[META_REPLAYED] is True
    assert count(tmp_path / "payments.db") == 1


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy"])
async def test_sync_tool_with_context(guard: Guard, mode: str) -> None:
    server = MCPServer("sync")
    effects: list[str] = []

    @guarded_tool(server, guard, key=["to"])
    def send(to: str, body: str, ctx: Context, idempotency_key: str = "") -> str:
        assert ctx.request_id is not None
        effects.append(idempotency_key)
        return f"sent to {to}"

    async with Client(server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools["send"].input_schema["properties"]) == {"to", "body", "task_id"}
        a = await client.call_tool("send", {"to": "bob", "body": "hi", "task_id": "t"})
        b = await client.call_tool("send", {"to": "bob", "body": "hi", "task_id": "t"})
    assert text(a) == "sent to bob" and "sent to bob" in text(b) and len(effects) == 1
    # The returned function is the guarded one: callable from Python inside a task.
    with task("t"):
        assert send("bob", "hi", None) == "sent to bob"  # type: ignore[arg-type]
    assert len(effects) == 1


def test_demo_ledger_is_stripe_like(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "p.db")
    a, new_a = ledger.charge("o", 100, "usd", "k1")
    b, new_b = ledger.charge("o", 100, "usd", "k1")
    assert a == b and new_a and not new_b
    with pytest.raises(IdempotencyError):
        ledger.charge("o", 200, "usd", "k1")
    c, _ = ledger.charge("o", 100, "usd", None)
    d, _ = ledger.charge("o", 100, "usd", None)
    assert len({a.id, c.id, d.id}) == 3 and count(tmp_path / "p.db") == 3
    r1 = ledger.refund(a.id, None, "r")
    assert ledger.refund(a.id, None, "r") == r1 and r1.amount_cents == 100


BAD_TASK_IDS = [
    pytest.param(["job-1"], id="list"), pytest.param({"id": "job-1"}, id="dict"), pytest.param(True, id="bool"),
    pytest.param(42, id="int"), pytest.param(4.5, id="float"), pytest.param("", id="empty"),
    pytest.param("   ", id="blank"), pytest.param(None, id="null"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("bad", BAD_TASK_IDS)
async def test_a_bad_task_id_is_refused_not_replaced(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    # _meta and the environment both name task job-1, which already charged this order: falling back to
    # them would replay job-1's charge as this call's outcome.
    monkeypatch.setenv("AGENTGUARD_TASK_ID", "job-1")
    first = await client.call_tool("create_charge", {**CHARGE, "task_id": "job-1"})
    res = await client.call_tool("create_charge", {**CHARGE, "task_id": bad}, meta={META_TASK_ID: "job-1"})
    assert not first.is_error
    assert res.is_error and text(res).endswith("Nothing was executed.")
    assert "the task id from the task_id argument must be" in text(res)
    assert res.structured_content is None and not (res.meta or {}).get(META_REPLAYED)
    assert count(tmp_path / "payments.db") == 1


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [pytest.param(42, id="int"), pytest.param("", id="empty")])
async def test_a_bad_meta_task_id_is_refused_not_replaced(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    monkeypatch.setenv("AGENTGUARD_TASK_ID", "job-1")
    await client.call_tool("create_charge", {**CHARGE, "task_id": "job-1"})
    res = await client.call_tool("create_charge", dict(CHARGE), meta={META_TASK_ID: bad})
    assert res.is_error and text(res).endswith("Nothing was executed.")
    assert "the task id from _meta['dev.agentguard/task_id'] must be" in text(res)
    assert count(tmp_path / "payments.db") == 1


@pytest.mark.anyio
async def test_an_absent_task_id_falls_back_to_the_environment(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTGUARD_TASK_ID", "job-7")
    a = await client.call_tool("create_charge", dict(CHARGE))
    b = await client.call_tool("create_charge", {**CHARGE, "task_id": "job-7"})
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert not a.is_error and b.meta and b.meta[META_REPLAYED] is True
    assert count(tmp_path / "payments.db") == 1
    # The schema still asks for a string, with no default: what an absent one means is agentguard's rule.
    prop = tools["create_charge"].input_schema["properties"]["task_id"]
    assert prop["type"] == "string" and "default" not in prop and "reuse" in prop["description"].lower()


@pytest.mark.storeless
@pytest.mark.anyio
async def test_a_misspelt_name_is_refused_before_the_tool_is_registered(guard: Guard) -> None:
    server = MCPServer("payments")
    for options, refusal in (
        ({"key": "orderid"}, "key='orderid' is not an argument of create_charge (did you mean 'order_id'?)"),
        ({"inject": "idempotency"}, "inject='idempotency' is not an argument of create_charge (did you mean "
                                    "'idempotency_key'?)"),
    ):
        with pytest.raises(TypeError) as info:

            @guarded_tool(server, guard, **options)  # type: ignore[arg-type]
            async def create_charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> str:
                return order_id

        assert str(info.value).startswith(refusal)
    assert await server.list_tools() == []
