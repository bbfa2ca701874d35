"""The tests' layout stays true: every test file sits in the folder of what it exercises (``core``,
``stores``, ``mcp_server``, ``integrations``, ``console``, the repository as a whole in ``project``), none is left
flat in ``tests/``, and only the files in ``tests/whitebox/`` import a private module or name of agentguard — so
a change to a private module knows its whitebox tests, and every other test goes through what users can import.

Imports are read from each file's syntax tree (a name in a string or a docstring is not an import)."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.storeless  # reads files only

TESTS = Path(__file__).resolve().parents[1]
FOLDERS = frozenset({"core", "stores", "mcp_server", "integrations", "console", "project", "whitebox"})


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.endswith("__") for part in dotted.split("."))


def private_uses(source: str) -> Iterator[tuple[int, str]]:
    """Each private agentguard module or name ``source`` imports (or reaches as an attribute of a module it
    imported, or imports with ``importlib.import_module``), with its line."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # a name bound by an import -> the agentguard module or name it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] == "agentguard":
                    if _private(alias.name):
                        yield node.lineno, alias.name
                    modules[alias.asname or "agentguard"] = alias.name if alias.asname else "agentguard"
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.partition(".")[0] == "agentguard":
                for alias in node.names:
                    if _private(f"{node.module}.{alias.name}"):
                        yield node.lineno, f"{node.module}.{alias.name}"
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in {"importlib.import_module", "import_module"}:
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("agentguard") and (
                    _private(arg.value)):
                yield node.lineno, arg.value
    for node in ast.walk(tree):  # agentguard._keys, stores._console: a private attribute of an imported module
        if isinstance(node, ast.Attribute):
            chain = []
            base: ast.expr = node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules and not _private(modules[base.id]):
                dotted = ".".join([modules[base.id], *reversed(chain)])
                if _private(dotted):
                    yield node.lineno, dotted


def all_test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_no_test_file_is_left_flat_and_each_sits_in_a_known_folder() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    assert {p.parent.name for p in all_test_files()} <= FOLDERS
    assert all(p.parent.parent == TESTS for p in all_test_files())  # one level: the folders hold no folders
    assert not list(TESTS.rglob("__init__.py"))  # (no packages: pytest imports each file by its own name)
    twice = [name for name, n in Counter(p.name for p in all_test_files()).items() if n > 1]
    assert twice == []  # so two files may not share a name


def test_no_folder_shadows_a_module_agentguard_looks_for() -> None:
    """``tests/`` is on ``sys.path`` (``conftest.py`` lives there), so a folder named like a top-level module an
    extra brings (``mcp``, say) would be found as a namespace package where that extra is not installed: the
    floors' virtualenv would then not hear that the extra is missing."""
    looked_for = set()
    for path in (TESTS.parent / "agentguard").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] in {"require", "missing"}:
                looked_for |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    assert {"mcp", "pydantic_ai", "langchain_core"} <= looked_for  # (the walk finds what it should)
    assert FOLDERS.isdisjoint(looked_for)


def test_only_the_whitebox_tests_import_private_names() -> None:
    found = {str(p.relative_to(TESTS)): sorted({name for _, name in private_uses(p.read_text())})
             for p in all_test_files() if p.parent.name != "whitebox"}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_checker_catches_what_it_should() -> None:
    """Each way of reaching a private name is caught; the public names, strings and docstrings are not."""
    caught = {
        "from agentguard._keys import derive_key": "agentguard._keys.derive_key",
        "import agentguard._ledger as ledger": "agentguard._ledger",
        "import agentguard.stores._lane": "agentguard.stores._lane",
        "from agentguard.stores import _console as views": "agentguard.stores._console",
        "from agentguard import _codec": "agentguard._codec",
        "from agentguard.mcp import proxy\nproxy._FinalError": "agentguard.mcp.proxy._FinalError",
        "import agentguard\nagentguard._guard.X": "agentguard._guard",
        "import importlib\nimportlib.import_module('agentguard._doctor')": "agentguard._doctor",
        "def f():\n    from agentguard._extras import require": "agentguard._extras.require",
    }
    for source, name in caught.items():
        assert name in {n for _, n in private_uses(source)}, source
    clean = ('"""agentguard._keys.derive_key"""\nfrom agentguard import Guard, __version__, sub_key\n'
             'from agentguard.stores import SQLStore\nimport agentguard\nagentguard.__file__\n'
             'code = "from agentguard._keys import derive_key"\nfrom _pytest import fixtures\n'
             'from agentguard.mcp import proxy\nproxy.GuardingProxy\nfrom conftest import _helper\n')
    assert list(private_uses(clean)) == []
