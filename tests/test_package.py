"""The package as the index would ship it: the wheel is built, installed into a fresh virtualenv (the wheel
from here, its dependencies from the index) and used from there, away from this checkout — the demo, the
packaged MCP demo server, and the README's proxy config as a pip user writes it."""

from __future__ import annotations

import email
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from agentguard import __version__

from conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.storeless,  # the package, not a store
]

README_EXAMPLE = re.compile(r"## Example\n\n```python\n(.*?)```", re.DOTALL)
PROBLEM = re.compile(r"^Agents re-invoke tools:.*?\n\n", re.DOTALL | re.MULTILINE)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a process back at the checkout or its virtualenv."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "AGENTGUARD_URL", "PYTHONHOME"}
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=120)
    [built] = out.glob("agentguard-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with ``pip install 'agentguard[mcp]'`` from the wheel."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120, env=clean_env())
    subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[mcp]"], check=True,
                   capture_output=True, timeout=180, env=clean_env())
    yield home


def test_the_wheel_holds_the_package_its_license_and_a_long_description_for_the_index(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = email.message_from_string(z.read(f"agentguard-{__version__}.dist-info/METADATA").decode("utf-8"))
    assert wheel.name == f"agentguard-{__version__}-py3-none-any.whl"
    assert {"agentguard/py.typed", "agentguard/cli.py", "agentguard/servers/payments_demo.py",
            f"agentguard-{__version__}.dist-info/licenses/LICENSE"} <= names
    assert {n.split("/")[0] for n in names} == {"agentguard", f"agentguard-{__version__}.dist-info"}
    assert meta["License-Expression"] == "MIT" and meta["Author"] == "agentguard contributors"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert {u.split(",")[0] for u in meta.get_all("Project-URL")} >= {"Homepage", "Repository", "Issues", "Changelog"}
    assert set(meta.get_all("Provides-Extra")) >= {"postgres", "mcp", "temporal", "pydantic-ai", "integrations"}
    assert meta["Description-Content-Type"] == "text/markdown"
    description = meta.get_payload()
    assert isinstance(description, str)
    # pip users first (a clone's commands come last), the README's example as written, and no link the
    # index could not follow
    assert description.split("```bash\n", 1)[1].startswith("pip install agentguard")
    assert description.index("pip install agentguard") < description.index("bash scripts/test.sh")
    links = re.findall(r"\]\(([^)]+)\)", description)
    assert links and all(link.startswith("https://") for link in links), links
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [readme_example] = README_EXAMPLE.findall(readme)
    [long_example] = README_EXAMPLE.findall(description)
    assert long_example == readme_example  # one example, kept in step
    [readme_problem] = PROBLEM.findall(readme)
    [long_problem] = PROBLEM.findall(description)
    assert long_problem == readme_problem  # and one statement of the problem


def test_the_installed_package_runs_its_demo_away_from_the_checkout(venv: Path, tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import agentguard; print(agentguard.__file__)"], cwd=tmp_path,
                           env=clean_env(), capture_output=True, text=True, check=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's copy, not the checkout
    version = subprocess.run([str(venv / "bin" / "agentguard"), "--version"], cwd=tmp_path, env=clean_env(),
                             capture_output=True, text=True, timeout=60)
    assert version.stdout == f"agentguard {__version__}\n"
    demo = subprocess.run([str(venv / "bin" / "agentguard"), "demo"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "OK: 3 charges for 3 orders" in demo.stdout and demo.stderr == ""
    served = subprocess.run([str(python), "-c", "import agentguard.servers.payments_demo as d; print(d.build_server)"],
                            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert served.returncode == 0 and "build_server" in served.stdout, served.stderr


@pytest.mark.anyio
async def test_a_pip_user_runs_the_proxy_example_against_the_packaged_demo_server(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "agentguard.toml").write_text(
        '[store]\nurl = "sqlite+aiosqlite:///.agentguard/claims.db"\n\n'
        '[upstream]\ncommand = ["python", "-m", "agentguard.servers.payments_demo"]\n'
        'env = { PAYMENTS_DEMO_DB = "payments.db" }\n\n'
        '[tools.create_charge]\nkey = ["order_id"]\nignore = ["memo"]\nforward_key_to = "idempotency_key"\n'
    )
    params = StdioServerParameters(command=str(venv / "bin" / "agentguard"),
                                   args=["mcp-proxy", "--config", "agentguard.toml"], cwd=str(tmp_path),
                                   env={"AGENTGUARD_LOG": "ERROR"})
    charge = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-8812"}
    async with Client(params) as client:
        first = await client.call_tool("create_charge", {**charge, "memo": "first"})
        again = await client.call_tool("create_charge", {**charge, "memo": "retried"})
    assert not first.is_error and not again.is_error
    assert again.meta and again.meta["dev.agentguard/replayed"] is True
    assert again.structured_content == first.structured_content
    listed = await anyio.run_process([str(venv / "bin" / "agentguard"), "ls", "--config", "agentguard.toml", "--json"],
                                     cwd=tmp_path, env=clean_env(), check=False)
    assert [r["state"] for r in json.loads(listed.stdout)["records"]] == ["succeeded"], listed.stderr


def test_the_changelog_gives_the_readmes_figures() -> None:
    """The 0.1.0 section of CHANGELOG.md quotes every figure of the README's speed table."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Speed, measured"):readme.index("What the numbers mean")]
    figures = set(re.findall(r"\d+(?:\.\d+)?–\d+(?:\.\d+)?(?:×| µs)?|\d\.\d\d×", table))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    section = changelog[changelog.index("## [0.1.0]"):]
    section = section[:section.index("\n## [", 1)] if "\n## [" in section[1:] else section
    missing = sorted(f.rstrip("× µs") for f in figures if f.rstrip("× µs") not in section)
    assert len(figures) >= 10 and missing == [], missing
