"""A key or a task by its start, as a person types it: ``show``, ``forget`` and ``resolve`` take a key's start,
``timeline`` a task id's, when nothing else starts the same way; a start several share is refused (status 1)
with the matches listed. And the demo ends with the two commands that show what it did, which work as
printed. On the suite's backend."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from agentguard import Guard, ResultNotStoredError, task

from cli_runs import record, run
from conftest import BACKEND, tid

pytestmark = pytest.mark.slow


def keys_of(url: str, task_id: str) -> list[str]:
    out = run("ls", "--url", url, "--task", task_id, "--json", cwd=Path.cwd())
    assert out.returncode == 0, out.stderr
    return sorted(r["key"] for r in json.loads(out.stdout)["records"])


def unique_start(key: str, others: list[str]) -> str:
    """The shortest start of ``key`` (past ``ag_``) that none of ``others`` shares."""
    n = 4
    while any(o != key and o.startswith(key[:n]) for o in others):
        n += 1
    return key[:n]


def test_show_and_forget_take_a_keys_unique_start(store_url: str, tmp_path: Path) -> None:
    t = tid()
    record(store_url, task_id=t, n=3)
    keys = keys_of(store_url, t)
    first = keys[0]
    start = unique_start(first, keys)
    shown = run("show", start, "--url", store_url, "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["record"]["key"] == first
    text = run("show", start, "--url", store_url, cwd=tmp_path)
    assert text.stdout.startswith(f"{first}  scope=default  task={t}\n")
    gone = run("forget", start, "--yes", "--url", store_url, cwd=tmp_path)
    assert gone.returncode == 0 and gone.stdout.startswith(f"forgot {first} "), gone.stderr
    assert keys_of(store_url, t) == keys[1:]  # that record, and only it


def test_a_start_several_keys_share_lists_them_and_changes_nothing(store_url: str, tmp_path: Path) -> None:
    t = tid()
    record(store_url, task_id=t, n=3)
    keys = keys_of(store_url, t)
    for args in (("show", "ag_"), ("forget", "ag_", "--yes"), ("resolve", "ag_", "--retry")):
        out = run(*args, "--url", store_url, cwd=tmp_path)
        assert out.returncode == 1 and out.stdout == "", out
        lines = out.stderr.splitlines()
        assert lines[0] == "agentguard: 'ag_' is the start of several keys; give more of it, or the whole key:"
        assert [line.split()[0] for line in lines[1:]] == keys  # each key, with where it is
        assert all(f"task={t}" in line for line in lines[1:]) and "Traceback" not in out.stderr
    assert keys_of(store_url, t) == keys  # forget deleted nothing


def test_more_matches_than_shown_say_so(store_url: str, tmp_path: Path) -> None:
    t = tid()
    record(store_url, task_id=t, n=12)
    out = run("show", "ag_", "--url", store_url, cwd=tmp_path)
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and len(lines) == 12, out.stderr  # the first line, 10 keys, and:
    assert lines[-1] == "  ... and more (the first 10 are shown)"


def test_a_whole_key_or_a_start_nothing_has_is_as_before(store_url: str, tmp_path: Path) -> None:
    t = tid()
    record(store_url, task_id=t, n=2)
    for key in keys_of(store_url, t):
        out = run("show", key, "--url", store_url, "--json", cwd=tmp_path)
        assert out.returncode == 0 and json.loads(out.stdout)["record"]["key"] == key
    missing = run("show", "ag_zz", "--url", store_url, cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.startswith("agentguard: no record 'ag_zz'"), missing.stderr


def test_timeline_takes_a_tasks_unique_start_and_an_exact_id_wins(store_url: str, tmp_path: Path) -> None:
    t = tid()
    for task_id in (f"{t}-alpha", f"{t}-beta", f"{t}-b", f"{t}-50%_x", f"{t}-50ab"):
        record(store_url, task_id=task_id)
    one = run("timeline", f"{t}-al", "--url", store_url, "--json", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    doc = json.loads(one.stdout)
    assert doc["task_id"] == f"{t}-alpha" and [a["kind"] for a in doc["attempts"]] == ["ran"]
    exact = run("timeline", f"{t}-b", "--url", store_url, "--json", cwd=tmp_path)  # also the start of -beta
    assert exact.returncode == 0 and json.loads(exact.stdout)["task_id"] == f"{t}-b", exact.stderr
    # % and _ are characters like any other, not wildcards: "-50%" is the start of one task only
    literal = run("timeline", f"{t}-50%", "--url", store_url, "--json", cwd=tmp_path)
    assert literal.returncode == 0 and json.loads(literal.stdout)["task_id"] == f"{t}-50%_x", literal.stderr
    several = run("timeline", f"{t}-", "--url", store_url, cwd=tmp_path)
    assert several.returncode == 1 and several.stdout == ""
    lines = several.stderr.splitlines()
    assert lines[0] == f"agentguard: '{t}-' is the start of several tasks; give more of it, or the whole task:"
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(
        f"{t}-{s}" for s in ("alpha", "beta", "b", "50%_x", "50ab"))


def test_resolve_takes_a_held_operations_unique_start(store_url: str, tmp_path: Path) -> None:
    t = tid()
    guard = Guard(store_url)

    @guard.once
    def count() -> int:
        return "many"  # type: ignore[return-value]  # the annotation refuses it: the outcome is held

    with task(t), pytest.raises(ResultNotStoredError) as held:
        count()
    guard.close()
    key = held.value.key
    assert key is not None
    record(store_url, task_id=t, n=3)
    start = unique_start(key, keys_of(store_url, t))
    out = run("resolve", start, "--retry", "--url", store_url, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "cleared for a retry: its next call runs it again\n", out.stderr
    assert "no operations with an unknown outcome" in run("ls", "--unknown", "--url", store_url, cwd=tmp_path).stdout


def recorded(stdout: str) -> list[list[str]]:
    """The commands the demo's last lines print, as argv lists (their comments left out)."""
    tail = stdout.split("\nWhat agentguard recorded:\n", 1)[1]
    return [shlex.split(line, comments=True) for line in tail.splitlines() if line.strip()]


def check_the_demos_commands(demo_out: str, cwd: Path, url: str | None) -> None:
    commands = recorded(demo_out)
    assert [c[:2] for c in commands] == [["agentguard", "timeline"], ["agentguard", "show"]], commands
    if url is not None:
        assert all(c[-2:] == ["--url", url] for c in commands), commands
    else:
        assert all("--url" not in c for c in commands), commands
    timeline = run(*commands[0][1:], cwd=cwd)
    assert timeline.returncode == 0, timeline.stderr
    kinds = [line.split()[2:4] for line in timeline.stdout.splitlines()]
    assert ["TAKEOVR", "took_over"] in kinds and ["REFUSED", "refused"] in kinds, timeline.stdout
    assert len(commands[1][2]) < 51  # a start of the key, not the whole of it
    shown = run(*commands[1][1:], cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(commands[1][2]) and 'operation  charge[order_id="o-3"]' in shown.stdout
    assert "took_over" in shown.stdout and "state      succeeded" in shown.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="the demo's worker is killed with SIGKILL")
def test_the_demo_ends_with_the_two_commands_that_show_what_it_did(store_url: str, tmp_path: Path) -> None:
    out = run("demo", "--url", store_url, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    check_the_demos_commands(out.stdout, tmp_path, store_url)


@pytest.mark.skipif(BACKEND != "sqlite", reason="the demo's default store is embedded SQLite")
def test_on_the_default_store_the_demos_commands_need_no_url(tmp_path: Path) -> None:
    for _ in range(2):  # a second run: the commands still name its own task and record
        out = run("demo", cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        check_the_demos_commands(out.stdout, tmp_path, None)
