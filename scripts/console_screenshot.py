"""Make docs/console.png: a task's page in ``agentguard console``, shot in headless Chromium.

    python scripts/console_screenshot.py [OUT.png]      (default: docs/console.png)

Needs the console extra, Playwright and Debian's ``chromium`` (as the browser tests do). A throwaway SQLite
store gets one support task made by real guarded calls — an order looked up, a card charged in two steps by
two identical calls at once (one runs, the other waits and replays), the charge asked again (a replay) and
with another amount (refused), a refund declined — and the console is started on it, shot and stopped.
Nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agentguard import Guard, KeyReuseError, Operation, task

ROOT = Path(__file__).resolve().parent.parent
TASK = "ticket-4711"


class RefundDeclined(Exception):
    pass


async def seed(url: str) -> None:
    async with Guard(url) as guard:

        @guard.once(key=["order_id"])
        async def lookup_order(order_id: str) -> dict[str, object]:
            await asyncio.sleep(0.05)
            return {"order_id": order_id, "total_cents": 4200}

        async def provider_charge(amount_cents: int, idempotency_key: str) -> dict[str, object]:
            await asyncio.sleep(0.35)
            return {"id": "ch_" + idempotency_key[-10:], "amount_cents": amount_cents}

        async def email(order_id: str) -> str:
            await asyncio.sleep(0.12)
            return "sent"

        @guard.once(key=["order_id"])
        async def charge(order_id: str, amount_cents: int, op: Operation) -> dict[str, object]:
            paid = await op.step("charge", provider_charge, amount_cents, idempotency_key=op.key("charge"))
            await op.step("send_receipt", email, order_id)
            return paid

        @guard.once(key=["order_id"], cache_errors=(RefundDeclined,))
        async def refund(order_id: str, amount_cents: int) -> str:
            await asyncio.sleep(0.08)
            raise RefundDeclined("the card issuer declined the refund")

        with task(TASK, scope="shop"):
            await lookup_order("o-1001")
            await asyncio.sleep(0.1)
            # the model emits the same call twice at once: one runs, the other waits and replays
            await asyncio.gather(charge("o-1001", 4200), charge("o-1001", 4200))
            await asyncio.sleep(0.15)
            await charge("o-1001", 4200)  # the model asks again: a replay
            await asyncio.sleep(0.1)
            with contextlib.suppress(KeyReuseError):
                await charge("o-1001", 4300)  # the same order, another amount: refused, nothing runs
            await asyncio.sleep(0.1)
            with contextlib.suppress(RefundDeclined):
                await refund("o-1001", 4200)


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "console.png"
    chromium = shutil.which("chromium")
    if chromium is None:
        print("needs Debian's chromium (apt-get install chromium)", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/agentguard.db"
        asyncio.run(seed(url))
        server = subprocess.Popen([sys.executable, "-m", "agentguard.cli", "console", "--url", url, "--port", "0"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            printed = ""
            for line in server.stdout:
                printed += line
                if "read-only:" in line:
                    break
            found = re.search(r"(http://\S+)/\?token=(\S+)", printed)
            if found is None:
                print(printed, file=sys.stderr)
                return 1
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, chromium_sandbox=False)
                page = browser.new_page(viewport={"width": 1000, "height": 620})
                page.goto(f"{found[1]}/?token={found[2]}")
                page.goto(f"{found[1]}/task?scope=shop&id={TASK}")
                page.screenshot(path=str(out))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
            if server.stdout is not None:
                server.stdout.close()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
