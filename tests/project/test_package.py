"""The package as the index would ship it: the sdist and the wheel built as a release builds them (the wheel
from the sdist), checked as the index checks them (``twine check --strict``), the wheel installed alone into a
fresh virtualenv (its dependencies from the index, no extra) and used from there, away from this checkout —
the demo, the command, the packaged MCP demo server; then the mcp extra added, and the README's proxy config
run as a pip user writes it.

The distribution is ``agentguard-idempotency`` (the index refuses ``agentguard``: ``agent-guard`` exists); the
import package and the command are ``agentguard``."""

from __future__ import annotations

import email
import email.message
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
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

DIST = "agentguard-idempotency"
STEM = f"agentguard_idempotency-{__version__}"  # the files' names: the distribution's, normalised
PYTHONS = {"3.11", "3.12", "3.13"}  # those scripts/pythons.sh runs the demo and a core set on
README_EXAMPLE = re.compile(r"## Example\n\n```python\n(.*?)```", re.DOTALL)
PROBLEM = re.compile(r"^Agents re-invoke tools:.*?\n\n", re.DOTALL | re.MULTILINE)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a process back at the checkout or its virtualenv."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "AGENTGUARD_URL", "PYTHONHOME"}
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, as ``python -m build`` makes a release: the wheel is built from the sdist, so
    an sdist missing a file fails here."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], capture_output=True,
                           text=True, timeout=300, env=clean_env())
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return {"sdist": out / f"{STEM}.tar.gz", "wheel": out / f"{STEM}-py3-none-any.whl"}


@pytest.fixture(scope="module")
def wheel(dists: dict[str, Path]) -> Path:
    return dists["wheel"]


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        return email.message_from_string(z.read(f"{STEM}.dist-info/METADATA").decode("utf-8"))


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with the wheel alone installed: ``pip install agentguard-idempotency``, no extra."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120, env=clean_env())
    subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=300, env=clean_env())
    yield home


@pytest.fixture(scope="module")
def venv_mcp(venv: Path, wheel: Path) -> Path:
    """The same virtualenv once the mcp extra is added (tests on the wheel alone come first in this file)."""
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[mcp]"], check=True,
                   capture_output=True, timeout=300, env=clean_env())
    return venv


def test_twine_check_passes_on_the_sdist_and_the_wheel(dists: dict[str, Path]) -> None:
    out = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(dists["sdist"]),
                          str(dists["wheel"])], capture_output=True, text=True, timeout=120, env=clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("PASSED") == 2, out.stdout


def test_the_sdist_is_the_distribution_with_the_tests_and_the_docs(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        names = set(tar.getnames())
        info = tar.extractfile(f"{STEM}/PKG-INFO")
        assert info is not None
        meta = email.message_from_bytes(info.read())
    assert (meta["Name"], meta["Version"]) == (DIST, __version__)
    assert {f"{STEM}/{n}" for n in ("pyproject.toml", "README.md", "LICENSE", "agentguard/__init__.py",
                                    "agentguard/__main__.py", "tests/project/test_package.py", "docs/pypi.md",
                                    "scripts/test.sh")} <= names


def test_the_metadata_names_the_distribution_its_pythons_and_only_the_users_extras(wheel: Path) -> None:
    meta = wheel_metadata(wheel)
    assert meta["Name"] == DIST and meta["Version"] == __version__ and meta["Requires-Python"] == ">=3.11"
    classifiers = meta.get_all("Classifier") or []
    minor = re.compile(r"Programming Language :: Python :: (3\.\d+)")
    versions = {m[1] for c in classifiers if (m := minor.fullmatch(c))}
    assert versions == PYTHONS  # exactly the versions tested
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"postgres", "mcp", "console", "integrations", "frameworks-a", "frameworks-b"} <= extras
    assert not extras & {"dev", "bench"}  # the project's own tools are dependency groups, not published
    requires = meta.get_all("Requires-Dist") or []
    assert not [r for r in requires if re.match(r"(pytest|mypy|ruff|twine|build|aws-lambda-powertools)\b", r)]
    # An extra made of extras names this distribution, which the build expands into their parts; under any
    # other name (the old `agentguard[...]`) it would be published as a requirement on another project.
    assert not [r for r in requires if re.match(r"agentguard\b", r)], requires
    frameworks_a = {r.split(">=")[0] for r in requires if r.endswith("; extra == 'frameworks-a'")}
    assert frameworks_a == {"smolagents", "agno", "llama-index-core"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert set(project["dependency-groups"]) == {"dev", "bench"}
    urls = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("[project.urls]\n", 1)[1]
    assert urls.startswith("# PLACEHOLDERS until the repository is public")  # until it is


def test_the_wheel_holds_the_package_its_license_and_a_long_description_for_the_index(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    meta = wheel_metadata(wheel)
    assert {"agentguard/py.typed", "agentguard/cli.py", "agentguard/__main__.py",
            "agentguard/servers/payments_demo.py", f"{STEM}.dist-info/licenses/LICENSE"} <= names
    assert {n.split("/")[0] for n in names} == {"agentguard", f"{STEM}.dist-info"}
    assert meta["License-Expression"] == "MIT" and meta["Author"] == "agentguard contributors"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert {u.split(",")[0] for u in meta.get_all("Project-URL")} >= {"Homepage", "Repository", "Issues", "Changelog"}
    assert set(meta.get_all("Provides-Extra")) >= {"postgres", "mcp", "temporal", "pydantic-ai", "integrations"}
    assert meta["Description-Content-Type"] == "text/markdown"
    description = meta.get_payload()
    assert isinstance(description, str)
    # pip users first (a clone's commands come last), the README's example as written, and no link the
    # index could not follow
    assert description.split("```bash\n", 1)[1].startswith(f"pip install {DIST} ")
    assert description.index(f"pip install {DIST}") < description.index("bash scripts/test.sh")
    assert "pip install agentguard " not in description and "'agentguard[" not in description
    links = re.findall(r"\]\(([^)]+)\)", description)
    assert links and all(link.startswith("https://") for link in links), links
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [readme_example] = README_EXAMPLE.findall(readme)
    [long_example] = README_EXAMPLE.findall(description)
    assert long_example == readme_example  # one example, kept in step
    [readme_problem] = PROBLEM.findall(readme)
    [long_problem] = PROBLEM.findall(description)
    assert long_problem == readme_problem  # and one statement of the problem


def test_the_wheel_alone_runs_its_demo_away_from_the_checkout(venv: Path, tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import agentguard; print(agentguard.__file__)"], cwd=tmp_path,
                           env=clean_env(), capture_output=True, text=True, check=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's copy, not the checkout
    installed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], cwd=tmp_path, env=clean_env(),
                               capture_output=True, text=True, check=True, timeout=60)
    have = {d["name"].lower() for d in json.loads(installed.stdout)}
    assert DIST in have and not have & {"agentguard", "mcp", "asyncpg", "psycopg", "starlette", "httpx"}, have
    for argv in ([str(venv / "bin" / "agentguard"), "--version"], [str(python), "-m", "agentguard", "-V"]):
        version = subprocess.run(argv, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
        assert version.stdout == f"agentguard {__version__}\n", version.stderr
    demo = subprocess.run([str(venv / "bin" / "agentguard"), "demo"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "OK: 3 charges for 3 orders" in demo.stdout and demo.stderr == ""
    assert "agentguard timeline ticket-" in demo.stdout and "agentguard show ag_" in demo.stdout
    # every public name of the package, with only its own dependencies installed
    public = subprocess.run([str(python), "-c", "from agentguard import *; print(Guard, Operation, INJECTED)"],
                            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert public.returncode == 0 and "agentguard.INJECTED" in public.stdout, public.stderr
    lacking = subprocess.run([str(venv / "bin" / "agentguard"), "mcp-proxy", "--config", "x.toml"], cwd=tmp_path,
                             env=clean_env(), capture_output=True, text=True, timeout=60)
    assert lacking.returncode == 2 and f"pip install '{DIST}[mcp]'" in lacking.stderr, lacking.stderr


def test_the_packaged_demo_server_imports_with_the_mcp_extra(venv_mcp: Path, tmp_path: Path) -> None:
    served = subprocess.run([str(venv_mcp / "bin" / "python"), "-c",
                             "import agentguard.servers.payments_demo as d; print(d.build_server)"],
                            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert served.returncode == 0 and "build_server" in served.stdout, served.stderr


@pytest.mark.anyio
async def test_a_pip_user_runs_the_proxy_example_against_the_packaged_demo_server(venv_mcp: Path, tmp_path: Path
                                                                                   ) -> None:
    venv = venv_mcp
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
