"""Key shapes: every provider gets a key it accepts, written from at least 160 bits of the key's digest, the same
in every process, on every attempt and on a takeover; and the key a tool receives is always the guard's."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, GuardError, KeyReuseError, Operation, current_key, downstream, sub_key, task
from agentguard._keys import derive_key
from agentguard.downstream import ADYEN, SHAPES, SQUARE, STRIPE, KeyShape, key_shape, shape_key
from tests.conftest import ToolKind, tid

pytestmark = pytest.mark.anyio

storeless = pytest.mark.storeless

KEY = derive_key("acct_42", "ticket-8812", 'charge[order_id="o-1"]')  # pinned in test_whitebox_keys

# (shape, the longest key the provider takes, the alphabet of what follows the prefix)
PROVIDERS: list[tuple[Any, int, str]] = [
    ("stripe", 255, "[0-9a-f]"),
    ("adyen", 64, "[0-9a-f]"),
    ("square", 45, "[a-z2-7]"),
    (40, 40, "[a-z2-7]"),
    (35, 35, "[a-z2-7]"),
    (KeyShape(32, prefix=""), 32, "[a-z2-7]"),
    (KeyShape(27, "base64url", prefix=""), 27, "[A-Za-z0-9_-]"),
    (KeyShape(44, "hex", prefix="k"), 44, "[0-9a-f]"),  # 43 hex digits: 172 bits
]
IDS = [p[0] if isinstance(p[0], str | int) else f"{p[0].alphabet}-{p[0].max_length}" for p in PROVIDERS]


def sample_keys(n: int) -> list[str]:
    """Keys of ``n`` distinct operations, and three sub-keys of each."""
    keys = [derive_key("acct_42", f"t-{i // 7}", f'charge[order_id="o-{i}"]') for i in range(n)]
    return keys + [sub_key(k, name) for k in keys for name in ("charge", "fee", "refund")]


@storeless
@pytest.mark.parametrize(("shape", "limit", "alphabet"), PROVIDERS, ids=IDS)
def test_every_key_and_sub_key_fits_its_provider(shape: Any, limit: int, alphabet: str) -> None:
    resolved = key_shape(shape)
    form = re.compile(re.escape(resolved.prefix) + alphabet + "+")
    for key in sample_keys(500):
        shaped = shape_key(key, shape)
        assert len(shaped) == resolved.length <= limit and form.fullmatch(shaped), shaped
        assert shaped.isascii() and shaped.strip() == shaped
    assert resolved.bits >= 160


@storeless
def test_the_shapes_are_pinned_and_stripe_and_adyen_keep_the_key_as_it_is() -> None:
    # Stores and providers hold these: a change here is a new key for every operation in flight.
    assert [shape_key(KEY, s) for s in (None, "stripe", "adyen", STRIPE, ADYEN, 51, 64, 255)] == [KEY] * 8
    assert KEY == "ag_6739037c5c0f63e2a13c8498e81181094263933a7a46164b"
    assert shape_key(KEY, "square") == shape_key(KEY, 45) == "ag_m44qg7c4b5r6fij4qsmoqembbfbghez2pjdbmsy"
    assert shape_key(KEY, 40) == "ag_m44qg7c4b5r6fij4qsmoqembbfbghez2pjdbm"
    assert shape_key(KEY, KeyShape(27, "base64url", prefix="")) == "ZzkDfFwPY-KhPISY6BGBCUJjkzp"
    assert shape_key(sub_key(KEY, "fee"), "square") == "ag_3aumeuuwz5jnpcqvxacj4cxrlrri3lybcvhjliy"
    assert SHAPES == {"stripe": STRIPE, "adyen": ADYEN, "square": SQUARE}
    assert {p[0] for p in PROVIDERS if isinstance(p[0], str)} == set(SHAPES)  # each is tested above
    assert (STRIPE.max_length, ADYEN.max_length, SQUARE.max_length) == (255, 64, 45)
    assert [s.bits for s in (STRIPE, ADYEN, SQUARE)] == [192, 192, 192]


@storeless
def test_a_shape_that_holds_the_whole_digest_is_a_rewriting_of_it() -> None:
    """No two keys share a shaped key, by construction: the shaped key gives back the digest whole, and each of
    the 192 bits, flipped alone, gives another shaped key."""
    digest = bytes.fromhex(KEY[3:])
    square = shape_key(KEY, "square")
    assert base64.b32decode(square[3:].upper() + "=") == digest
    b64 = shape_key(KEY, KeyShape(32, "base64url", prefix=""))
    assert base64.urlsafe_b64decode(b64) == digest
    for shape in ("square", KeyShape(32, "base64url", prefix=""), KeyShape(42, "base32", prefix="")):
        flipped = set()
        for bit in range(192):
            other = int.from_bytes(digest, "big") ^ (1 << bit)
            flipped.add(shape_key("ag_" + other.to_bytes(24, "big").hex(), shape))
        assert len(flipped) == 192 and shape_key(KEY, shape) not in flipped


@storeless
@pytest.mark.parametrize("shape", [40, 35, KeyShape(32, prefix=""), KeyShape(27, "base64url", prefix="")],
                         ids=["40", "35", "base32-32", "base64url-27"])
def test_a_shorter_shape_keeps_at_least_160_bits(shape: Any) -> None:
    resolved = key_shape(shape)
    assert 160 <= resolved.bits < 192
    value = int(KEY[3:], 16)
    for bit in range(192 - resolved.bits, 192):  # each of the leading `bits` bits, the ones the shape keeps
        other = "ag_" + (value ^ (1 << bit)).to_bytes(24, "big").hex()
        assert shape_key(other, shape) != shape_key(KEY, shape)


@storeless
def test_no_two_operations_share_a_shaped_key() -> None:
    keys = sample_keys(25_000)  # 100,000 keys: operations and sub-keys
    assert len(set(keys)) == len(keys)
    for shape in ("square", 35, KeyShape(27, "base64url", prefix="")):
        assert len({shape_key(k, shape) for k in keys}) == len(keys)


@storeless
def test_another_process_writes_the_same_shaped_keys(python: str) -> None:
    shapes = ["stripe", "adyen", "square", 40, 35]
    code = (
        "import json, sys\n"
        "from agentguard import sub_key\n"
        "from agentguard._keys import derive_key\n"
        "from agentguard.downstream import shape_key\n"
        f"shapes = {shapes!r}\n"
        "keys = [derive_key('acct_42', f't-{i}', f'charge[order_id=\"o-{i}\"]') for i in range(200)]\n"
        "keys += [sub_key(k, 'fee') for k in keys]\n"
        "print(json.dumps([[shape_key(k, s) for s in shapes] for k in keys]))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    keys = [derive_key("acct_42", f"t-{i}", f'charge[order_id="o-{i}"]') for i in range(200)]
    keys += [sub_key(k, "fee") for k in keys]
    assert json.loads(out.stdout) == [[shape_key(k, s) for s in shapes] for k in keys]


@storeless
def test_shapes_that_cannot_be_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"at most 34 characters cannot hold 160 bits of the digest: base32 needs "
                                         r"32 characters .* 'ag_' \(at least 35 in all\); .*prefix=''.*base64url"):
        key_shape(34)
    with pytest.raises(ValueError, match=r"at most 26 characters cannot hold 160 bits .* base64url needs 27"):
        KeyShape(26, "base64url", prefix="")
    with pytest.raises(ValueError, match=r"at most 39 characters cannot hold 160 bits .* hex needs 40"):
        KeyShape(39, "hex", prefix="")
    with pytest.raises(ValueError, match=r"no key shape is named 'sqare': did you mean 'square'\?"):
        key_shape("sqare")
    with pytest.raises(ValueError, match=r"'paypal': the named ones are 'stripe', 'adyen', 'square'; .* \(an int\)"):
        key_shape("paypal")
    for bad in (True, 45.0, ["square"]):
        with pytest.raises(TypeError, match="a key shape is a provider's name, a maximum length"):
            key_shape(bad)
    for length in (0, -1, True):
        with pytest.raises(ValueError, match="max_length must be a positive int"):
            KeyShape(length)
    with pytest.raises(ValueError, match="prefix may hold letters, digits"):
        KeyShape(45, prefix="ag:")
    with pytest.raises(ValueError, match="alphabet is 'hex', 'base32' or 'base64url'"):
        KeyShape(45, "base36")  # type: ignore[arg-type]
    for not_a_key in ("mine", KEY.upper(), KEY + "0", shape_key(KEY, "square")):
        with pytest.raises(ValueError, match="is not a downstream key agentguard derived"):
            shape_key(not_a_key, "square")


# -- the key a guarded tool receives ----------------------------------------------------------------------------


async def test_key_shape_shapes_the_injected_key_and_every_helper_agrees(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    guard = make_guard()
    seen: list[dict[str, str]] = []
    crashes = [ConnectionError("lost the provider's answer")]

    @kind.once(guard, key=["order_id"], key_shape="square")
    def charge(order_id: str, idempotency_key: str = "") -> str:
        seen.append({
            "injected": idempotency_key, "raw": current_key(), "current": current_key("square"),
            "fee": downstream.key("fee", shape="square"), "raw_fee": downstream.key("fee"),
            "forty": current_key(40),
        })
        if crashes:
            raise crashes.pop()  # released: the retry runs the body again, with the same keys
        return idempotency_key

    with task(tid()):
        with pytest.raises(ConnectionError):
            await charge("o-1")
        first = await charge("o-1")
        assert await charge("o-1") == first  # replayed
    (record,) = await guard.records()
    assert len(seen) == 2 and seen[0] == seen[1]
    keys = seen[0]
    assert keys["raw"] == record.key and keys["injected"] == first == keys["current"]
    assert keys["injected"] == shape_key(record.key, "square") and len(first) == 42
    assert keys["fee"] == shape_key(sub_key(record.key, "fee"), "square") == shape_key(keys["raw_fee"], 45)
    assert keys["forty"] == shape_key(record.key, 40)
    assert len({keys["injected"], keys["fee"]}) == 2


async def test_a_multi_step_tools_sub_keys_take_a_shape(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    calls: list[tuple[str, str]] = []

    @guard.once(key=["order_id"], key_shape="square")
    async def checkout(order_id: str, op: Operation, idempotency_key: str = "") -> list[str]:
        async def call(name: str) -> str:
            calls.append((name, op.key(name, shape="square")))
            return op.key(name, shape="square")

        return [idempotency_key, await op.step("charge", call, "charge"), await op.step("fee", call, "fee")]

    with task(tid()):
        injected, charge_key, fee_key = await checkout("o-1")
    (record,) = await guard.records()
    assert injected == shape_key(record.key, "square")
    assert charge_key == shape_key(sub_key(record.key, "charge"), "square")
    assert fee_key == shape_key(sub_key(record.key, "fee"), "square")
    assert all(len(k) == 42 for k in (injected, charge_key, fee_key)) and len({injected, charge_key, fee_key}) == 3


async def test_key_shape_is_checked_at_decoration(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()

    def charge(order_id: str) -> str:
        return order_id

    for shape in ("square", "adyen", 45):
        with pytest.raises(TypeError, match=r"charge: key_shape shapes the injected key, but the function takes no "
                                            r"parameter 'idempotency_key'; .* current_key\(shape=...\)"):
            guard.once(key_shape=shape)(charge)
    with pytest.raises(ValueError, match="did you mean 'square'"):
        guard.once(key_shape="Square")(charge)
    with pytest.raises(ValueError, match="cannot hold 160 bits"):
        guard.once(key_shape=20)(charge)
    with pytest.raises(GuardError, match="outside a guarded call"):
        current_key("square")


@pytest.mark.slow
async def test_a_takeover_after_a_crash_gets_the_same_shaped_keys(store_url: str, tmp_path: Path, python: str) -> None:
    """A worker process is killed by SIGKILL inside the tool; after its lease expires, this process takes the
    claim over: the body runs again with the very keys the dead worker forwarded."""
    t, effects = tid(), tmp_path / "effects"
    worker = (
        "import asyncio, sys\n"
        "from agentguard import Guard, downstream, task\n"
        "async def main(url, task_id, path):\n"
        "    async with Guard(url, lease=1.0) as guard:\n"
        "        @guard.once(key=['order_id'], key_shape='square')\n"
        "        async def charge(order_id: str, idempotency_key: str = '') -> str:\n"
        "            with open(path, 'a') as f:\n"
        "                f.write(idempotency_key + ' ' + downstream.key('fee', shape='square') + '\\n')\n"
        "            print('started', flush=True)\n"
        "            await asyncio.sleep(60)\n"
        "            return idempotency_key\n"
        "        with task(task_id):\n"
        "            await charge('o-1')\n"
        "asyncio.run(main(*sys.argv[1:]))\n"
    )
    proc = await asyncio.create_subprocess_exec(python, "-c", worker, store_url, t, str(effects),
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None and (await proc.stdout.readline()).strip() == b"started"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    events: list[str] = []
    async with Guard(store_url, lease=1.0, on_event=lambda e: events.append(e.kind)) as guard:

        @guard.once(key=["order_id"], key_shape="square")
        async def charge(order_id: str, idempotency_key: str = "") -> str:
            with effects.open("a") as f:
                f.write(idempotency_key + " " + downstream.key("fee", shape="square") + "\n")
            return idempotency_key

        with task(t):
            key = await charge("o-1")  # waits for the dead worker's lease, then takes over
        (record,) = await guard.records()
    dead, taker = (line.split() for line in effects.read_text().splitlines())
    assert "takeover" in events and record.attempts == 2
    assert dead == taker == [key, shape_key(sub_key(record.key, "fee"), "square")]
    assert key == shape_key(record.key, "square")


# -- a value sent for the injected parameter never reaches the body ---------------------------------------------


async def test_a_key_sent_through_kwargs_is_replaced_by_the_guards(
    make_guard: Callable[..., Guard], kind: ToolKind
) -> None:
    """A tool that takes ``**kwargs`` would take a model's ``idempotency_key`` there: the guard drops it, and the
    body receives the guard's key; the dropped value is not fingerprinted either (another one replays)."""
    guard = make_guard()
    received: list[tuple[str, dict[str, Any]]] = []

    @kind.once(guard, key=["order_id"])
    def charge(order_id: str, idempotency_key: str = "", **extra: Any) -> str:
        received.append((idempotency_key, extra))
        return idempotency_key

    @kind.once(guard, key=["order_id"], key_shape="square")
    def keyword_only(order_id: str, *, idempotency_key: str = "", **extra: Any) -> str:
        received.append((idempotency_key, extra))
        return idempotency_key

    with task(tid()):
        key = await charge("o-1", idempotency_key="forged", memo="x")
        assert await charge("o-1", idempotency_key="forged-again", memo="x") == key  # replayed, not a reuse
        with pytest.raises(KeyReuseError):
            await charge("o-1", memo="y")  # what is fingerprinted still counts
        square = await keyword_only("o-2", idempotency_key="forged")
    records = {r.operation: r.key for r in await guard.records()}
    assert received == [(key, {"memo": "x"}), (square, {})]
    assert key == records['charge[order_id="o-1"]'] and square == shape_key(records['keyword_only[order_id="o-2"]'], 45)


async def test_a_multi_step_tools_injected_parameters_cannot_be_sent_either(make_guard: Callable[..., Guard]) -> None:
    # Here the key went through inspect.BoundArguments, where **kwargs' values used to overwrite the guard's.
    guard = make_guard()
    received: list[tuple[str, Any, dict[str, Any]]] = []

    @guard.once(key=["order_id"])
    async def checkout(order_id: str, op: Operation, *, idempotency_key: str = "", **extra: Any) -> str:
        received.append((idempotency_key, op, extra))
        return idempotency_key

    t = tid()
    with task(t):
        key = await checkout("o-1", idempotency_key="forged", note="n")
    (record,) = await guard.records()
    assert key == record.key and [(k, type(op), extra) for k, op, extra in received] == [
        (record.key, Operation, {"note": "n"})
    ]
    with task(t):
        await checkout("o-2", op="forged-op")
    assert isinstance(received[-1][1], Operation)


async def test_without_kwargs_the_signature_refuses_a_sent_key_before_anything_runs(
    make_guard: Callable[..., Guard]
) -> None:
    guard = make_guard()
    runs: list[str] = []

    @guard.once(key=["order_id"])
    async def charge(order_id: str, idempotency_key: str = "") -> str:
        runs.append(idempotency_key)
        return idempotency_key

    with task(tid()), pytest.raises(TypeError, match="idempotency_key"):
        await charge("o-1", idempotency_key="forged")  # type: ignore[call-arg]
    assert runs == [] and await guard.records() == []

