"""The maps for the next engineer stay true: every file, module, class, function and test that
docs/architecture.md and AGENTS.md name in backticks exists, and no two modules of the package import each
other, directly or around a circle (as docs/architecture.md says).

Read with regexes over the markdown, resolved against the code's own syntax trees (nothing is imported but the
standard library's modules a reference names):

- a path (``agentguard/_machine.py``, ``tests/whitebox/test_executors.py::test_...``, ``scripts/test.sh``, a bare
  ``_store.py`` or ``test_direct.py``) exists, and a test it names is defined in its file;
- a dotted reference (``Machine.begin``, ``_keys.derive_key``, ``agentguard._context.id_problem``,
  ``Machine.begin/succeed``, ``SQLStore.direct()``) names a module's top-level name or a class's member (its
  bases' included), or else a standard library attribute (``inspect.Signature.bind``);
- a bare class-like name (``PendingBeats``) is defined somewhere in the code, or is a known outside name.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.storeless  # reads files only

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/architecture.md", "AGENTS.md")
ROOTS = ("agentguard/", "tests/", "model/", "scripts/", "benchmarks/", "chaos/", "docs/", "examples/", "servers/",
         ".ci/")
SUBPACKAGES = ("stores/", "mcp/", "integrations/", "console/", "servers/")  # written without ``agentguard/``
CODE = ("agentguard", "tests", "benchmarks", "chaos", "scripts")
# Names of other projects a doc may show as they are (a bare class-like name not defined in this code).
OUTSIDE = frozenset({"TypeAdapter", "MCPServer", "Starlette", "NamedTuple", "ParamSpec", "ToolException"})
FILE_ENDINGS = frozenset({"py", "md", "toml", "pml", "db", "json", "sh", "txt", "yml", "yaml", "cfg", "ini"})

TICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"(?P<ref>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?P<alts>(?:/[A-Za-z_]\w*)+)?(?:\([^()]*\))?")
CLASSLIKE = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*(?:\([^()]*\))?")
PATHLIKE = re.compile(r"[\w./-]+(?:::\w+)?")


def ticked(doc: str) -> list[str]:
    """What ``doc`` writes in backticks, code blocks left out."""
    text = re.sub(r"^```.*?^```", "", (ROOT / doc).read_text(), flags=re.S | re.M)
    return TICKED.findall(text)


# -- what the code defines ---------------------------------------------------------------------------------


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


class Module:
    """A module's top-level names and its classes' members (``self.x`` assigned in a method included)."""

    def __init__(self, path: Path) -> None:
        tree = _tree(path)
        self.names: set[str] = set()
        self.classes: dict[str, tuple[set[str], list[str]]] = {}
        for node in _top_level(tree.body):
            self.names.update(_bound(node))
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = (_members(node), [ast.unparse(b).split("[")[0] for b in node.bases])


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)


def _targets(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _targets(elt)


def _bound(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _targets(target)
    elif isinstance(node, ast.AnnAssign):
        yield from _targets(node.target)
    elif isinstance(node, ast.Import | ast.ImportFrom):
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0]


def _members(cls: ast.ClassDef) -> set[str]:
    members: set[str] = set()
    for node in cls.body:
        members.update(_bound(node))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            members.update(e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)
                           and isinstance(e.value, str))
    for found in ast.walk(cls):  # self.x = ..., self.a, self.b = ..., self.x: T = ...
        targets = found.targets if isinstance(found, ast.Assign) else [found.target] if isinstance(
            found, ast.AnnAssign) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    members.add(t.attr)
    return members


@cache
def modules() -> dict[str, Module]:
    """Every module of the code, by its dotted name (a package by its own); of the tests, their helpers
    (``conftest``), not the test files (a test a doc names is looked up in its file)."""
    found = {}
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if top == "tests" and path.name.startswith("test_"):
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = Module(path)
    return found


@cache
def _named(short: str) -> list[Module]:
    """The modules a doc may mean by ``short`` (``_keys``, ``stores._attempts``, ``agentguard._context``)."""
    return [m for name, m in modules().items() if name == short or name.endswith("." + short)]


def _member(cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether some class named ``cls`` in the code has ``member``, itself or through a base named in the code."""
    for module in modules().values():
        if cls in module.classes and cls not in seen:
            members, bases = module.classes[cls]
            if member in members or any(_member(b.rsplit(".", 1)[-1], member, seen | {cls}) for b in bases):
                return True
    return False


def _classes() -> set[str]:
    return {c for m in modules().values() for c in m.classes}


def resolves(ref: str) -> bool:
    """Whether the dotted ``ref`` names something in the code (or in the standard library)."""
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):  # the longest start that names a module
        for module in _named(".".join(parts[:cut])):
            rest = parts[cut:]
            if not rest:
                return True
            if rest[0] in module.names and (len(rest) == 1 or (len(rest) == 2 and _member(rest[0], rest[1]))):
                return True
    if parts[0] in _classes():
        return len(parts) == 2 and _member(parts[0], parts[1])
    for cut in range(len(parts), 0, -1):  # not ours: the standard library's (importing it costs nothing)
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@cache
def _defined(path: Path) -> frozenset[str]:
    """The functions and classes ``path`` defines, at any depth (a test in a class too)."""
    return frozenset(n.name for n in ast.walk(_tree(path))
                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))


@cache
def _package_dirs() -> list[Path]:
    return [ROOT / "agentguard", *(d for d in (ROOT / "agentguard").rglob("*") if (d / "__init__.py").exists())]


def path_problem(token: str) -> str | None:
    """What is wrong with the path ``token`` names (None: it exists, and so does the test or the name it names).
    A path may name a module without its ``.py`` (``stores/_console``) and a name in it (``stores/_lane.Lane``)."""
    path, _, test = token.partition("::")
    path = path.rstrip(",.;:")
    if "/" in path and not path.startswith(ROOTS + SUBPACKAGES):
        return None  # not a path of this repository (a URL, a virtualenv's)
    stem, dot, member = path.rpartition(".")
    if "/" in path and dot and "/" not in member and member not in FILE_ENDINGS:  # stores/_lane.Lane
        if (problem := path_problem(stem + ".py")) is not None:
            return problem
        module = ".".join((stem if stem.startswith(ROOTS) else f"agentguard/{stem}").split("/"))
        return None if resolves(f"{module}.{member}") else f"{stem}.py defines no {member}"
    if "/" in path and not dot and not path.endswith("/"):  # stores/_console: a module, or a folder
        path = path + ".py" if any((ROOT / t / f"{path}.py").exists() for t in ("", "agentguard")) else path
    if path.startswith(ROOTS):
        where = [ROOT / path]
    elif path.startswith(SUBPACKAGES):
        where = [ROOT / "agentguard" / path, ROOT / path]
    elif "/" not in path and path.endswith(".py"):
        where = [ROOT / top / path for top in ("tests", "benchmarks", "chaos", "scripts")]
        where += sorted((ROOT / "tests").glob(f"*/{path}"))  # a test file, in the folder of what it tests
        where += [d / path for d in _package_dirs()]
    elif "/" not in path and path.endswith(".md"):
        where = [ROOT / path, ROOT / "docs" / path]
    else:
        return None  # not a file of this repository (a config file's name, a database's)
    found = [w for w in where if w.exists()]
    if not found:
        return f"{path} does not exist"
    if test and not any(test in _defined(f) for f in found if f.suffix == ".py"):
        return f"{path} defines no {test}"
    return None


def problems(doc: str) -> list[str]:
    """Every reference of ``doc`` that names nothing, with what is wrong."""
    wrong = []
    for token in ticked(doc):
        for word in token.split():
            pathlike = PATHLIKE.fullmatch(word.rstrip(",.;:")) and ("/" in word or word.endswith((".py", ".md")))
            if pathlike and (problem := path_problem(word)) is not None:
                wrong.append(f"`{token}`: {problem}")
        if dotted := DOTTED.fullmatch(token):
            ref = dotted["ref"]
            if ref.rsplit(".", 1)[-1] in FILE_ENDINGS:
                continue
            head = ref.rsplit(".", 1)[0]
            for name in [ref, *(f"{head}.{alt}" for alt in (dotted["alts"] or "").split("/") if alt)]:
                if not resolves(name):
                    wrong.append(f"`{token}`: {name} names nothing in the code")
        elif CLASSLIKE.fullmatch(token):
            name = token.split("(")[0]
            defined = any(name in m.names or name in m.classes for m in modules().values())
            if not defined and name not in OUTSIDE and not hasattr(builtins, name):
                wrong.append(f"`{token}`: {name} is defined nowhere in the code")
    return wrong


@pytest.mark.parametrize("doc", DOCS)
def test_every_reference_in_the_docs_names_something_that_exists(doc: str) -> None:
    assert problems(doc) == []


def test_the_checker_catches_what_it_should() -> None:
    """A reference to something removed is caught, whichever way it is written; one to what exists is not."""
    assert resolves("Machine.begin") and resolves("_keys.derive_key") and resolves("inspect.Signature.bind")
    assert resolves("agentguard._context.id_problem") and resolves("SQLStore.write_attempts")  # (a base's)
    assert resolves("Statements.watch") and resolves("Claim.fence")  # (``self.x = ...``; ``__slots__``)
    assert not resolves("Engine.begin") and not resolves("_engine.Engine") and not resolves("Machine.drive")
    assert not resolves("json.no_such_function")
    assert path_problem("tests/whitebox/test_executors.py::test_a_plan_refused_at_once_goes_on_where_it_stopped") is (
        None)
    assert path_problem("agentguard/_here.py") == "agentguard/_here.py does not exist"
    assert path_problem("_engine.py") == "_engine.py does not exist"
    assert path_problem("stores/_lane.Lane") is None and path_problem("stores/_console") is None
    assert path_problem("stores/_lane.Pool") == "stores/_lane.py defines no Pool"
    assert path_problem("tests/core/test_guard.py::test_no_such_test") == (
        "tests/core/test_guard.py defines no test_no_such_test")


# -- the import direction ------------------------------------------------------------------------------------


def _imports(runtime: bool) -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports. ``runtime``: those a process runs
    (in functions too, never under ``TYPE_CHECKING``); else those at module level, ``TYPE_CHECKING`` included."""
    names = {name for name in modules() if name.split(".")[0] == "agentguard"}
    graph: dict[str, set[str]] = {}
    for name in names:
        path = ROOT / (name.replace(".", "/") + ("/__init__.py" if (ROOT / name.replace(".", "/")).is_dir()
                                                 else ".py"))
        tree = _tree(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        skipped = {id(n) for node in ast.walk(tree) if runtime and isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        nodes = ast.walk(tree) if runtime else _top_level(tree.body)
        graph[name] = set()
        for node in nodes:
            if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in names else module for a in node.names]
            for target in targets:
                while target not in names and "." in target:
                    target = target.rpartition(".")[0]
                if target in names and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


@pytest.mark.parametrize("runtime", [False, True], ids=["module level", "at run time"])
def test_no_two_modules_import_each_other(runtime: bool) -> None:
    graph = _imports(runtime)
    assert "agentguard._machine" in graph["agentguard._drive"]  # (the graph is read at all)
    assert circles(graph) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_store_imports_nothing_of_the_machine() -> None:
    """Data flows one way: the store knows nothing of tools, calls or the state machine (a listing's audit is
    read back by the codec, inside a function)."""
    allowed = {"agentguard._errors", "agentguard._redact", "agentguard._fork", "agentguard._extras",
               "agentguard._codec", "agentguard._stdlib_shims"}
    for name, imported in _imports(runtime=True).items():
        if name.startswith("agentguard.stores"):
            outside = {m for m in imported if not m.startswith("agentguard.stores")}
            assert outside <= allowed, (name, outside - allowed)
