"""A missing extra names the line that installs it. Each case runs in a subprocess whose import of the
extra's modules is blocked (the extras stay installed): by a ``sys.modules[name] = None`` shim, and by a
meta path finder that refuses them, as an environment without the package would."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.storeless  # imports only

SHIM = "import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
FINDER = (
    "import sys\n"
    "class Refuse:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if any(name == b or name.startswith(b + '.') for b in {blocked!r}):\n"
    "            raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)\n"
    "sys.meta_path.insert(0, Refuse())\n"
)
REPORT = (
    "try:\n"
    "    import {module}\n"
    "except ImportError as exc:\n"
    "    print(type(exc).__name__, isinstance(exc, ModuleNotFoundError), exc.name, sep='|')\n"
    "    print(exc)\n"
    "else:\n"
    "    print('imported')\n"
)

# module -> (the extra, the top-level modules it brings, any one of which missing is enough)
EXTRAS = {
    "agentguard.integrations.pydantic_ai": ("pydantic-ai", ["pydantic_ai"]),
    "agentguard.integrations.openai_agents": ("openai-agents", ["agents"]),
    "agentguard.integrations.langchain": ("langchain", ["langchain_core", "langgraph", "langchain"]),
    "agentguard.integrations.dbos": ("dbos", ["dbos"]),
    "agentguard.integrations.temporal": ("temporal", ["temporalio"]),
    "agentguard.integrations.smolagents": ("smolagents", ["smolagents"]),
    "agentguard.integrations.llamaindex": ("llamaindex", ["llama_index", "workflows"]),
    "agentguard.integrations.agno": ("agno", ["agno"]),
    "agentguard.integrations.google_adk": ("google-adk", ["google.adk"]),
    "agentguard.integrations.ag2": ("ag2", ["ag2"]),
    "agentguard.integrations.claude_agent_sdk": ("claude-agent-sdk", ["claude_agent_sdk"]),
    "agentguard.integrations.anthropic": ("anthropic", ["anthropic"]),
    "agentguard.servers.payments_demo": ("mcp", ["mcp", "mcp_types"]),
    "agentguard.mcp": ("mcp", ["mcp", "mcp_types"]),
    "agentguard.console": ("console", ["starlette", "uvicorn"]),
}
CASES = [(module, extra, name) for module, (extra, names) in EXTRAS.items() for name in names]
# agentguard/mcp/__init__.py does not call require() yet (the mcp package is being restructured): today its
# import fails with the SDK's own "No module named 'mcp_types'". strict: passing makes this marker fail.


def attempt(prelude: str, module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", prelude + REPORT.format(module=module)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize(
    ("module", "extra", "name"),
    CASES,
    ids=[f"{m}-{n}" for m, _, n in CASES],
)
@pytest.mark.parametrize("block", [SHIM, FINDER], ids=["sys.modules", "meta_path"])
def test_a_missing_extra_names_its_install_line(module: str, extra: str, name: str, block: str) -> None:
    lines = attempt(block.format(blocked=[name]), module)
    assert lines == [
        f"MissingExtraError|True|{name}",
        f"{module} needs the {extra} extra (no module named {name!r} is installed): "
        f"pip install 'agentguard-idempotency[{extra}]'",
    ]


def test_with_every_extra_missing_the_core_still_imports() -> None:
    others = {"asyncpg", "psycopg", "httpx", "httpx2", "stripe"}
    every = sorted({n for _, names in EXTRAS.values() for n in names} | others)
    code = SHIM.format(blocked=every) + (
        "import agentguard, agentguard.cli, agentguard.downstream, agentguard.integrations\n"
        "print(agentguard.__version__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr


@pytest.mark.parametrize("name", ["starlette", "uvicorn"])
def test_the_console_command_without_its_extra_names_the_install_line(name: str) -> None:
    code = SHIM.format(blocked=[name]) + "import sys\nfrom agentguard.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    out = subprocess.run([sys.executable, "-c", code, "console", "--url", "sqlite+aiosqlite:///nowhere.db"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == "", out.stderr
    assert out.stderr == (f"agentguard: agentguard console needs the console extra (no module named {name!r} is "
                          "installed): pip install 'agentguard-idempotency[console]'\n")


def test_a_postgres_store_without_asyncpg_names_the_extra() -> None:
    # The store should refuse at construction (a guard that is not in place refuses to start), not at the
    # first call with "cannot create the store engine ... No module named 'asyncpg'".
    code = SHIM.format(blocked=["asyncpg"]) + (
        "from agentguard import Guard\n"
        "try:\n"
        "    Guard('postgresql+asyncpg://u@127.0.0.1:1/db')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout == ("a postgresql+asyncpg:// store needs the postgres extra (no module named 'asyncpg' is "
                          "installed): pip install 'agentguard-idempotency[postgres]'\n"), out.stdout + out.stderr


