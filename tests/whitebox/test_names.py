"""The one check of the names a user writes (``agentguard._names``): the decorator, the MCP proxy's config, native
MCP tools and every adapter word their refusals with it (each adapter's test drives it in its framework's loop)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from agentguard import Guard
from agentguard._names import (
    argument_names,
    check_arguments,
    check_tools,
    closest,
    tool_problems,
    unknown_argument,
    unknown_tool,
)

pytestmark = [pytest.mark.storeless, pytest.mark.anyio]


def charge(order_id: str, amount_cents: int, memo: str = "", idempotency_key: str = "") -> None: ...


SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}}}


def test_the_closest_name_is_suggested_whatever_the_order_the_names_come_in() -> None:
    names = ["order_ref", "order_id", "order", "amount_cents"]
    assert closest("orderid", names) == closest("orderid", reversed(names)) == "order_id"
    assert closest("chargee", ["refund", "charge", "charges_list"]) == "charge"
    assert closest("order_id", ["order_id"]) == "order_id"


def test_nothing_close_suggests_nothing_and_the_names_are_listed_sorted() -> None:
    assert closest("zzz", ["order_id", "amount_cents"]) is None
    assert unknown_argument("zzz", ["order_id", "amount_cents"], tool="charge") == (
        "'zzz' is not an argument of charge; its arguments are: amount_cents, order_id")
    assert unknown_tool("zzz", ["refund", "charge"], offered_by="the agent") == (
        "the agent offers no tool named 'zzz'; it offers: charge, refund")
    assert unknown_tool("zzz", [], offered_by="the upstream") == (
        "the upstream offers no tool named 'zzz'; it offers: none")


def test_a_name_that_exists_is_no_problem() -> None:
    assert unknown_argument("order_id", ["order_id"], tool="charge") is None
    assert unknown_tool("charge", ["charge"], offered_by="the agent") is None
    check_arguments("charge", ["order_id", "memo"], {"key": ["order_id"], "ignore": ["memo"]})
    check_tools({"charge": {"key": ["order_id"]}}, {"charge": ["order_id"]}, where="X", offered_by="the agent")


def test_a_signature_and_a_json_schema_give_the_same_names() -> None:
    assert argument_names(SCHEMA) == ["amount_cents", "order_id"]
    assert argument_names(charge) == ["order_id", "amount_cents", "memo", "idempotency_key"]
    assert argument_names(inspect.signature(charge)) == argument_names(charge)
    assert argument_names({"type": "object"}) == [] and argument_names(None) == []
    by_schema = unknown_argument("orderid", argument_names(SCHEMA), tool="charge", field="key")
    by_signature = unknown_argument("orderid", ["order_id", "amount_cents"], tool="charge", field="key")
    assert by_schema == by_signature == (
        "key='orderid' is not an argument of charge (did you mean 'order_id'?); "
        "its arguments are: amount_cents, order_id")


def test_every_unknown_name_is_reported_at_once_in_the_order_written() -> None:
    wanted = {"chargee": {"key": ["order_id"]}, "refund": {"key": ["chargeid"], "ignore": ["reasn"]}}
    offered = {"charge": ["order_id"], "refund": ["charge_id", "reason"]}
    problems = tool_problems(wanted, offered, offered_by="the agent")
    assert [(p.tool, p.field, p.name) for p in problems] == [
        ("chargee", None, "chargee"), ("refund", "key", "chargeid"), ("refund", "ignore", "reasn")]
    with pytest.raises(ValueError) as info:
        check_tools(wanted, offered, where="GuardTools", offered_by="the agent")
    assert str(info.value) == (
        "GuardTools: 3 names do not exist:\n"
        "  - the agent offers no tool named 'chargee' (did you mean 'charge'?); it offers: charge, refund\n"
        "  - key='chargeid' is not an argument of refund (did you mean 'charge_id'?); its arguments are: "
        "charge_id, reason\n"
        "  - ignore='reasn' is not an argument of refund (did you mean 'reason'?); its arguments are: "
        "charge_id, reason")


async def test_the_decorator_refuses_with_the_one_wording(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    listing = "its arguments are: amount_cents, memo, order_id"
    for options, text in (
        ({"key": "orderid"}, f"key='orderid' is not an argument of charge (did you mean 'order_id'?); {listing}"),
        ({"ignore": ["mem"]}, f"ignore='mem' is not an argument of charge (did you mean 'memo'?); {listing}"),
        ({"inject": "idempotency"}, "inject='idempotency' is not an argument of charge (did you mean "
                                    "'idempotency_key'?); its arguments are: amount_cents, idempotency_key, memo, "
                                    "order_id"),
    ):
        with pytest.raises(TypeError) as info:
            guard.once(**options)(charge)
        assert str(info.value) == text
