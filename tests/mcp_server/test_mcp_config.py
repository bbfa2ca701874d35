"""The proxy's config: every mistake is named by its field (and line) on stderr, nothing reaches stdout, and
the exit code is non-zero before anything is served."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import agentguard
from agentguard.mcp import ConfigError, load_config, parse_config
from agentguard.mcp import proxy as proxy_module

pytestmark = pytest.mark.storeless  # independent of the store's backend

PACKAGE_ROOT = Path(agentguard.__file__).resolve().parent.parent

BAD = """\
[store]
ur = "sqlite+aiosqlite:///x.db"
lease = -1

[upstream]
env = { A = "1" }

[proxy]
on_conflict = "sometimes"

[tools.create_charge]
key = "order_id"
ignore = ["memo"]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return info.value.problems


def test_every_mistake_is_named_with_its_field_and_line() -> None:
    found = problems(BAD)
    joined = "\n".join(found)
    assert "store.ur (line 2): unknown field" in joined
    assert "store.lease (line 3)" in joined
    assert "upstream (line 5)" in joined and "exactly one of `command`" in joined
    assert "proxy.on_conflict (line 9)" in joined
    assert "tools.create_charge.key (line 12)" in joined
    assert len(found) == 5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[upstream]\ncommand = []\n", "upstream.command (line 2)"),
        ('[upstream]\nurl = "ftp://x"\n', "upstream.url (line 2): must be an http"),
        ('[upstream]\ncommand = ["x"]\nurl = "http://x/mcp"\n', "exactly one of"),
        ('[upstream]\ncommand = ["x"]\n[tools.pay]\nkey = ["a"]\nignore = ["a"]\n', "cannot be both"),
        ('[upstream]\ncommand = ["x"]\n[tools.pay]\nkey = ["task_id"]\n', "`task_id` is added by the proxy"),
        ('[upstream]\ncommand = ["x"]\n[tools.pay]\nforward_key_to = "k"\nkey = ["k"]\n', "cannot also be a key"),
        ('[upstream]\ncommand = ["x"]\npass_env = ["NOT A NAME"]\n', "upstream.pass_env (line 3)"),
        ('[store]\nurl = "mysql://x"\n[upstream]\ncommand = ["x"]\n', "store.url (line 2)"),
        ("[store]\n", "upstream: required field is missing"),
        ("[upstream\ncommand = 1\n", "not valid TOML"),
        ('[upstream]\ncommand = ["x"]\n[tools.pay]\nmark_structured = 3\n', "tools.pay.mark_structured (line 4)"),
    ],
)
def test_single_mistakes(text: str, expected: str) -> None:
    assert any(expected in p for p in problems(text)), problems(text)


def test_main_reports_on_stderr_only_and_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agentguard.toml"
    path.write_text(BAD)
    assert proxy_module.main(str(path)) != 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "store.ur" in err and "tools.create_charge.key" in err and "nothing was served" in err
    assert proxy_module.main(str(tmp_path / "missing.toml")) != 0
    out, err = capsys.readouterr()
    assert out == "" and "cannot read the config file" in err


def test_the_command_fails_before_serving(tmp_path: Path) -> None:
    path = tmp_path / "agentguard.toml"
    path.write_text(BAD)
    run = subprocess.run(
        [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(path)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={"PYTHONPATH": str(PACKAGE_ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode != 0
    assert run.stdout == ""  # stdout is the protocol: never a word of prose there
    assert "store.ur (line 2)" in run.stderr and "upstream (line 5)" in run.stderr


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "agentguard.toml"
    path.write_text(
        '[store]\nurl = "sqlite+aiosqlite:///claims.db"\n'
        '[upstream]\ncommand = ["python", "server.py"]\nenv = { X = "1" }\npass_env = ["SECRET", "ABSENT"]\n'
    )
    config = load_config(path)
    assert config.store_url() == f"sqlite+aiosqlite:///{conf.resolve() / 'claims.db'}"
    assert config.upstream_cwd() == conf.resolve()
    assert config.upstream_command() == (sys.executable, ["server.py"])
    assert config.upstream_env({"SECRET": "s", "OTHER": "o"}) == {"SECRET": "s", "X": "1"}


def test_store_url_defaults_to_the_environment() -> None:
    config = parse_config('[upstream]\ncommand = ["x"]\n')
    assert config.store_url({"AGENTGUARD_URL": "postgresql+asyncpg://h/db"}) == "postgresql+asyncpg://h/db"
    assert config.store_url({}).startswith("sqlite+aiosqlite:///") and config.store_url({}).endswith("agentguard.db")


def test_unknown_outcome_policy_defaults_follow_the_forwarded_key() -> None:
    config = parse_config('[upstream]\ncommand = ["x"]\n[tools.a]\nforward_key_to = "k"\n[tools.b]\n')
    assert config.tools["a"].unknown_policy == "retry" and config.tools["b"].unknown_policy == "hold"
