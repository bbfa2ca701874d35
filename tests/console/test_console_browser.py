"""The console in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright, against
``agentguard console`` started and stopped by the test, on a store seeded by real guarded calls (the held
outcome by a real SIGKILL inside a step). Loopback only.

Screenshots are saved under ``test-artifacts/console/<backend>/`` (or ``$AGENTGUARD_TEST_ARTIFACTS``).
Without Chromium or Playwright these tests are skipped, unless ``AGENTGUARD_REQUIRE_BROWSER=1`` (which
``scripts/test.sh`` sets, having installed Chromium), where a missing browser fails them.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import BACKEND, ROOT
from console_server import Running, console, held, many, seed, seeded

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("AGENTGUARD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("AGENTGUARD_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "console" / BACKEND


@pytest.fixture
def browser(store_url: str) -> Iterator[Any]:
    # Per test, and after the test's store: Playwright's sync API keeps an event loop running in this thread
    # while it is started, and the store fixture's own asyncio.run (a Postgres database made and dropped)
    # must run outside it.
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if CHROMIUM is None or sync_playwright is None:
        why = "no chromium on PATH (apt-get install chromium)" if CHROMIUM is None else "playwright is not installed"
        if os.environ.get("AGENTGUARD_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the browser tests must run here: {why}")
        pytest.skip(why)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        # Debian's Chromium, not a browser build Playwright would download; no sandbox as root in a container
        chromium = p.chromium.launch(executable_path=CHROMIUM, chromium_sandbox=False)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1100, "height": 800})
    try:
        yield ctx
    finally:
        ctx.close()


def shot(page: Any, name: str) -> None:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


def submit(page: Any, button: str) -> int:
    """Click a form's button; the status of the POST it sends (the page then shows where it led)."""
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.get_by_role("button", name=button).click()
    page.wait_for_load_state()
    status: int = posted.value.status
    return status


def test_a_person_reads_the_tasks_opens_a_timeline_and_settles_a_held_outcome(
    store_url: str, tmp_path: Path, context: Any
) -> None:
    seeded(store_url)
    with console(store_url, tmp_path / "console.log") as c:
        page = context.new_page()
        page.goto(c.sign_in)
        assert page.url == f"{c.base}/"  # signed in, and the token is no longer in the address
        assert "signed in with the token" in page.inner_text("header")
        assert page.locator("table.tasks tr").count() == 3  # a header and two tasks
        held_row = page.locator("table.held tr").nth(1).inner_text()
        assert "t-held" in held_row and "charge" in held_row and "ag_" in held_row
        shot(page, "tasks")

        page.locator("table.tasks").get_by_role("link", name="t-done").click()
        page.wait_for_load_state()
        assert page.locator("h1").inner_text() == "Task t-done"
        timeline = page.locator("svg.timeline")
        assert timeline.is_visible()
        spans = timeline.locator("rect.span")
        assert spans.count() == 2 and timeline.locator("rect.span.failed").count() == 1
        assert timeline.locator("path.mark.step").count() == 2  # the booking's two steps
        # the ledger's attempts: the booking ran and was replayed, the refund ran (its error stored)
        assert timeline.locator("circle.mark.ran").count() == 2
        assert timeline.locator("circle.mark.replayed").count() == 1
        timeline.screenshot(path=str(ARTIFACTS / "timeline.png"))
        shot(page, "task")

        refused = json.loads(seed(store_url, "resume", "t-held").stdout)  # the agent tries again: held
        assert refused["error"] == "OutcomeUnknownError"
        page.goto(f"{c.base}/")
        page.locator("table.held").get_by_role("link").last.click()
        page.wait_for_load_state()
        assert "unknown outcome" in page.locator("table.steps").inner_text()
        page.fill("textarea#result", '{"id": "ch_real", "amount_cents": 4200')  # a brace short
        assert submit(page, "record result") == 400
        assert "the result must be JSON" in page.get_by_role("alert").inner_text()
        assert page.input_value("textarea#result") == '{"id": "ch_real", "amount_cents": 4200'  # kept to fix
        assert "t-held" in held(store_url)  # nothing changed
        shot(page, "bad-json")

        page.fill("textarea#result", '{"id": "ch_real", "amount_cents": 4200}')
        assert submit(page, "record result") == 303
        assert "the step's result was recorded" in page.get_by_role("status").inner_text()
        shot(page, "settled")
        page.goto(f"{c.base}/")
        assert "No operation is held" in page.inner_text("main")
        answer = json.loads(seed(store_url, "resume", "t-held").stdout)
        assert answer["ok"]["charge"] == {"id": "ch_real", "amount_cents": 4200}
        # the held task's timeline: held on the unknown outcome, resolved by the operator, then carried on
        page.goto(f"{c.base}/task?scope=default&id=t-held")
        timeline = page.locator("svg.timeline")
        assert timeline.locator("circle.mark.unknown").count() == 1
        assert timeline.locator("rect.mark.resolved").count() == 1
        assert timeline.locator("circle.mark.took_over, circle.mark.ran").count() == 1
        timeline.screenshot(path=str(ARTIFACTS / "timeline-settled.png"))


@contextlib.contextmanager
def _page_server(html: str) -> Iterator[str]:
    """Serve ``html`` at / on another loopback port until the block ends; yields its URL."""
    body = html.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _foreign_form(c: Running, form_html: str) -> str:
    """A page elsewhere (not this console's origin) carrying a copy of the console's settle form."""
    return form_html.replace('action="/settle"', f'action="{c.base}/settle"')


def test_without_the_token_the_page_is_read_only_and_actions_are_refused(
    store_url: str, tmp_path: Path, browser: Any, context: Any
) -> None:
    key = seeded(store_url)["t-held"]
    with console(store_url, tmp_path / "console.log") as c:
        holder = context.new_page()
        holder.goto(c.sign_in)
        holder.goto(f"{c.base}/record?scope=default&key={key}")
        form_html = holder.locator("form.settle-retry").evaluate("f => f.outerHTML")
        assert 'name="csrf"' in form_html

        stranger_ctx = browser.new_context()
        try:
            stranger = stranger_ctx.new_page()
            stranger.goto(f"{c.base}/record?scope=default&key={key}")
            assert "read-only" in stranger.inner_text("header")
            assert stranger.locator("form[action='/settle']").count() == 0 and stranger.locator("pre").count() == 0
            assert "Settling needs the token" in stranger.inner_text("main")
            # the holder's own form, anti-forgery field and all, submitted without the token's cookie
            stranger.set_content(_foreign_form(c, form_html))
            assert submit(stranger, "retry step") == 403
            assert "actions need the token" in stranger.get_by_role("alert").inner_text()
            shot(stranger, "refused-without-token")
        finally:
            stranger_ctx.close()

        # the token's holder lured to a page elsewhere that posts the same form: refused too
        lure = context.new_page()
        lure.set_content(_foreign_form(c, form_html))
        assert submit(lure, "retry step") == 403
        # ... and from another port of this machine: the same site, so the browser sends the cookie along;
        # the console's origin check refuses it
        with _page_server(_foreign_form(c, form_html)) as elsewhere:
            lure.goto(elsewhere)
            assert submit(lure, "retry step") == 403
            assert "cross-site" in lure.get_by_role("alert").inner_text()
        assert "t-held" in held(store_url)  # nothing changed


def test_a_second_settle_from_a_stale_tab_is_refused_on_the_page(store_url: str, tmp_path: Path,
                                                                 context: Any) -> None:
    key = seeded(store_url, done=())["t-held"]
    with console(store_url, tmp_path / "console.log") as c:
        first, second = context.new_page(), context.new_page()
        first.goto(c.sign_in)
        for tab in (first, second):
            tab.goto(f"{c.base}/record?scope=default&key={key}")
        assert submit(first, "retry step") == 303
        assert "the step was cleared" in first.get_by_role("status").inner_text()
        second.fill("textarea#result", '{"id": "ch_guess"}')
        assert submit(second, "record result") == 409
        message = second.get_by_role("alert").inner_text()
        assert "changed since revision" in message and "nothing was changed" in message
        assert "another operator cleared its step for a retry" in message  # what changed, and by whom
        shot(second, "second-settle")
    answer = json.loads(seed(store_url, "resume", "t-held").stdout)
    assert answer["ok"]["charge"]["id"] != "ch_guess"  # the retry stood: the step ran again


def _count(page: Any) -> str:
    text: str = page.locator("nav.pager .count").first.inner_text()
    return text


def _search(page: Any, **fields: str) -> None:
    for name in ("task", "key", "operation", "scope"):
        page.fill(f"form[role=search] input[name={name}]", fields.get(name, ""))
    with page.expect_navigation():
        page.get_by_role("button", name="search").click()


def test_a_person_finds_a_task_by_its_id_a_record_by_its_key_and_pages_through_the_tasks(
    store_url: str, tmp_path: Path, context: Any
) -> None:
    many(store_url, [f"order-{i:03d}" for i in range(130)])
    two = many(store_url, ["two-ops"], operations=2)["two-ops"]
    many(store_url, ["elsewhere"], scope="acct-2")
    with console(store_url, tmp_path / "console.log") as c:
        page = context.new_page()
        page.goto(f"{c.base}/")
        assert _count(page) == "tasks 1–100 of 132"
        assert page.locator("table.tasks tr").count() == 101  # a header and a page of tasks
        page.get_by_role("link", name="next ›").first.click()
        page.wait_for_load_state()
        assert _count(page) == "tasks 101–132 of 132" and page.locator("table.tasks tr").count() == 33
        assert page.get_by_role("link", name="next ›").count() == 0
        shot(page, "tasks-page-2")

        def listed() -> list[str]:
            ids: list[str] = page.locator("table.tasks tr td:nth-child(2)").all_inner_texts()
            return ids

        _search(page, task="order-12")  # a task id's start
        assert sorted(listed()) == [f"order-{i}" for i in range(120, 130)]
        assert page.input_value("form[role=search] input[name=task]") == "order-12"  # the search stays in the form
        shot(page, "search-task")
        _search(page, scope="acct-2")
        assert listed() == ["elsewhere"]
        _search(page, operation="pay[n=1")  # an operation's start
        assert listed() == ["two-ops"]
        _search(page, key=two[1][:16])  # a key's start, as `agentguard show` takes it: its record's page
        assert page.locator("h1").inner_text() == "Record pay[n=1]" and page.url.endswith(f"key={two[1]}")
        assert two[1] in page.inner_text("main")
        page.goto(f"{c.base}/")
        _search(page, key="ag_")  # the start of every key: those it may name, each a link to its record
        assert "Several records' keys start with" in page.inner_text("main")
        assert page.locator("table.found tr").count() == 101  # a header and the first hundred
        page.locator("table.found").get_by_role("link", name="two-ops").first.click()
        page.wait_for_load_state()
        assert page.locator("h1").inner_text() == "Task two-ops" and _count(page) == "operations 1–2 of 2"


def test_a_task_page_shows_its_attempts_beside_its_timeline_and_marks_of_one_moment_apart(
    store_url: str, tmp_path: Path, browser: Any
) -> None:
    many(store_url, ["burst"], replays=12)  # one call, then twelve replays at once: within a millisecond or so
    wide = browser.new_context(viewport={"width": 1800, "height": 900})
    try:
        with console(store_url, tmp_path / "console.log") as c:
            page = wide.new_page()
            page.goto(f"{c.base}/task?scope=default&id=burst")
            timeline, table = page.locator("svg.timeline"), page.locator("table.attempts")
            heads = table.locator("th").all_inner_texts()
            assert {"ended (UTC)", "what happened", "who", "how long", "downstream key"} <= set(heads)
            lines = table.locator("tr[id]")
            assert lines.count() == 13
            first = lines.first.inner_text()
            assert "ran" in first and "succeeded" in first and "guard" in first and "ag_" in first
            assert lines.nth(1).inner_text().count("replayed") == 1
            # beside the timeline: the table's left edge is right of the picture
            svg_box, table_box = timeline.bounding_box(), table.bounding_box()
            assert svg_box is not None and table_box is not None
            assert table_box["x"] >= svg_box["x"] + svg_box["width"] and abs(table_box["y"] - svg_box["y"]) < 100
            # marks of the same moment, as the browser draws them: none covers another; what does not fit is
            # counted where it would be
            boxes = [b for b in (m.bounding_box() for m in timeline.locator("circle.mark").all()) if b is not None]
            more = sum(int(t.lstrip("+")) for t in timeline.locator("text.more").all_text_contents())
            assert len(boxes) > 1 and len(boxes) + more == 13
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    apart = (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                             or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])
                    assert apart, (a, b)
            shot(page, "task-attempts")
            # a mark leads to its line of the table, which the page then marks out
            timeline.locator("circle.mark.replayed").last.click()
            anchor = page.url.rsplit("#", 1)[1]
            line = page.locator(f"tr#{anchor}")
            assert "replayed" in line.inner_text() and line.is_visible()
            assert line.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(255, 245, 157)"
    finally:
        wide.close()
