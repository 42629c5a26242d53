"""The code's structure, read from its source: no import circle between the modules of the
package, the benchmarks or the test helpers (imports under ``TYPE_CHECKING`` included,
function-local imports not); no function in the engine glue or the algorithm longer than a
reader can hold (60 lines); the engine's rooms as ``vllm_lookahead/engine/__init__.py`` names
them, and vLLM imported by the engine only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vllm_lookahead"
# (folder, the folder its import names start from): the package, the benchmarks, the test helpers
SOURCES = ((PACKAGE, ROOT), (ROOT / "benchmarks", ROOT), (ROOT / "tests" / "support", ROOT / "tests"))
MAX_FUNCTION_LINES = 60
ENGINE_ROOMS = {"hooks", "step", "propose", "metrics"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, base in SOURCES:
        for path in folder.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """Module-level import statements, and those under a module-level ``if`` (``TYPE_CHECKING``)."""
    body = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If):
            body += node.body + node.orelse
    return [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in _top_level_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules():
    graph = import_graph()
    assert "vllm_lookahead.engine.runner" in graph["vllm_lookahead.engine.hooks.patches"]  # the parser sees imports
    assert circles(graph) == []


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_long_function_in_the_engine_or_the_algorithm():
    long = []
    for folder in ("engine", "core"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_the_engine_is_one_hub_and_its_rooms():
    engine = PACKAGE / "engine"
    top = {p.name for p in engine.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__")}
    assert top == {"__init__.py", "runner.py", *ENGINE_ROOMS}
    doc = (engine / "__init__.py").read_text()
    for room in ENGINE_ROOMS:
        for path in (engine / room).glob("*.py"):
            assert path.name == "__init__.py" or path.name in doc, (
                f"engine/__init__.py does not name {room}/{path.name}"
            )


def test_only_the_engine_imports_vllm():
    """The algorithm, the config, the kernels and the command line never import vLLM at module
    level (the command line starts it as a program), so a vLLM upgrade touches engine/ only."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "engine"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n == "vllm" or n.startswith("vllm.")
            ]
    assert found == []


def test_test_modules_have_unique_names():
    """pytest imports test modules by their base name (the test folders are no packages)."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
