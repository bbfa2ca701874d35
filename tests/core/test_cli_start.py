"""Starting fast and finding one's way: ``agentguard --help``, ``--version``/``-V`` and ``help [COMMAND]``
load neither SQLAlchemy nor pydantic nor asyncio (what made them take half a second), ``import agentguard``
neither, until a public name is used; ``python -m agentguard`` is the same command. The times themselves are
measured by ``python -m benchmarks.startup``, never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentguard
from agentguard import __version__

from conftest import ROOT

pytestmark = pytest.mark.storeless  # no store is opened

HEAVY = ("sqlalchemy", "pydantic", "pydantic_core", "asyncio", "aiosqlite", "asyncpg", "psycopg", "greenlet")


def loaded(*argv: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime ARGV`` as a user would (this checkout first on the path) and return the
    process and the top-level modules it imported."""
    env = {k: v for k, v in os.environ.items() if k != "AGENTGUARD_URL"} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    modules = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines()
               if line.startswith("import time:") and "|" in line}
    return out, modules


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("-V",), ("help",), ("help", "show"),
                                  ("show", "--help"), ("timeline", "--help")])
def test_help_and_version_import_no_store_no_pydantic_no_event_loop(tmp_path: Path, args: tuple[str, ...]) -> None:
    out, modules = loaded("-m", "agentguard", *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "agentguard" in modules and "argparse" in modules  # (the measure sees what was imported)
    assert sorted(modules & set(HEAVY)) == []


def test_import_agentguard_loads_its_names_on_first_use(tmp_path: Path) -> None:
    out, modules = loaded("-c", "import agentguard", cwd=tmp_path)
    assert out.returncode == 0 and sorted(modules & set(HEAVY)) == [], out.stderr
    used, modules = loaded("-c", "from agentguard import Guard; print(Guard.__module__)", cwd=tmp_path)
    assert used.returncode == 0, used.stderr
    assert {"sqlalchemy", "pydantic"} <= modules


def test_every_public_name_resolves_to_its_definition() -> None:
    code = (
        "import agentguard, importlib\n"
        "from agentguard import *\n"
        "names = [n for n in agentguard.__all__ if n != '__version__']\n"
        "assert set(agentguard.__all__) <= set(dir(agentguard))\n"
        "for n in names:\n"
        "    obj = getattr(agentguard, n)\n"
        "    assert globals()[n] is obj, n\n"
        "    home = importlib.import_module(type(obj).__module__ if n == 'INJECTED' else obj.__module__)\n"
        "    assert getattr(home, n) is obj, n\n"
        "try:\n"
        "    agentguard.Nope\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "module 'agentguard' has no attribute 'Nope'\n"
    with pytest.raises(ImportError, match="cannot import name 'Nope'"):
        from agentguard import Nope  # type: ignore[attr-defined]  # noqa: F401


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTGUARD_URL"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agentguard", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_python_dash_m_agentguard_is_the_command(tmp_path: Path) -> None:
    for flag in ("-V", "--version"):
        out = run(flag, cwd=tmp_path)
        assert (out.returncode, out.stdout, out.stderr) == (0, f"agentguard {__version__}\n", "")
    bare = run(cwd=tmp_path)  # no command: the help on stderr, status 2, as `agentguard` alone
    assert bare.returncode == 2 and bare.stderr.startswith("usage: agentguard ") and bare.stdout == ""
    assert agentguard.__file__ is not None
    assert (Path(agentguard.__file__).parent / "__main__.py").exists()


def test_help_shows_the_commands_help_or_a_commands(tmp_path: Path) -> None:
    whole = run("help", cwd=tmp_path)
    assert whole.returncode == 0 and whole.stderr == ""
    assert whole.stdout == run("--help", cwd=tmp_path).stdout
    assert "agentguard help COMMAND" in whole.stdout and "    help " in whole.stdout
    for command in ("show", "resolve", "doctor", "mcp-proxy", "demo"):
        one = run("help", command, cwd=tmp_path)
        assert one.returncode == 0 and one.stderr == ""
        assert one.stdout == run(command, "--help", cwd=tmp_path).stdout
        assert one.stdout.startswith(f"usage: agentguard {command} ")
    wrong = run("help", "shwo", cwd=tmp_path)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert "invalid choice: 'shwo'" in wrong.stderr and "'show'" in wrong.stderr


def test_the_key_and_task_arguments_say_a_start_will_do(tmp_path: Path) -> None:
    for command in ("show", "forget", "resolve", "timeline"):
        text = " ".join(run("help", command, cwd=tmp_path).stdout.split())
        assert "or its start if no other" in text, text


def test_the_startup_benchmark_runs_and_names_what_each_command_loads() -> None:
    """``python -m benchmarks.startup`` (the times of issue 33's target live there, never in a test): it runs,
    prints a row per command, and finds no third-party module behind --help and --version."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.startup", "--runs", "1"], cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {line[:32].strip(): line for line in out.stdout.splitlines()[2:]}
    assert set(rows) == {"python -c pass (the floor)", "agentguard --help", "agentguard --version",
                         "agentguard help show", "import agentguard", "from agentguard import Guard"}
    for quick in ("agentguard --help", "agentguard --version", "import agentguard"):
        assert rows[quick].rstrip().endswith("none"), rows[quick]
    assert "sqlalchemy" in rows["from agentguard import Guard"]
