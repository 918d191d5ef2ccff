"""The package's import structure, read from the source (``ast``), nothing imported:

- only ``pipeline_registry`` reaches into ``pipelines/`` from outside it (the commands of
  ``commands`` and ``run_checks`` do so inside functions, at the moment they run a pipeline's
  node function);
- the core packages (``workflow``, ``workers``, ``tasks``) import neither Kedro nor MLflow,
  nor the packages built on them;
- the generation engine (``generation``) sits below every package that generates: it imports
  none of them, nor Kedro or MLflow;
- no circle of module-level imports (``if TYPE_CHECKING:`` ones included: a circle there is
  still two modules that each need the other); imports inside functions are left out.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import conductor_pipeline

PACKAGE = "conductor_pipeline"
ROOT = Path(conductor_pipeline.__file__).parent

CORE = ("workflow", "workers", "tasks")
ENGINE = "generation"
ABOVE_CORE = ("pipelines", "serving", "training", "evaluation", "reporting")
# Modules outside pipelines/ that import from it, inside a function only, and why.
PIPELINE_CALLERS = {
    "conductor_pipeline.commands": "`conductor promote` runs the promotion node's decision",
    "conductor_pipeline.run_checks": "checks data_prep's parameters with its own validation",
}


@dataclass(frozen=True)
class Import:
    target: str  # a module name as written (resolved when relative)
    line: int
    top_level: bool  # False: inside a function (runs when the function is called)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports_of(name: str, path: Path) -> list[Import]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, top_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = top_level and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.Import):
                found.extend(Import(a.name, child.lineno, inside) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    # ``from pkg import module`` imports the module; any other name, pkg itself
                    sub = f"{base}.{alias.name}"
                    found.append(Import(sub if sub in modules() else base, child.lineno, inside))
            visit(child, inside)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return found


@cache
def imports() -> dict[str, list[Import]]:
    return {name: _imports_of(name, path) for name, path in modules().items()}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_only_the_pipeline_registry_imports_the_pipelines():
    pipelines = f"{PACKAGE}.pipelines"
    wrong = []
    for name, found in imports().items():
        if _within(name, pipelines) or name == f"{PACKAGE}.pipeline_registry":
            continue
        for imp in found:
            if not _within(imp.target, pipelines):
                continue
            if imp.top_level or name not in PIPELINE_CALLERS:
                wrong.append(f"{modules()[name].relative_to(ROOT)}:{imp.line} imports {imp.target}")
    assert not wrong, "only pipeline_registry.py imports from pipelines/:\n" + "\n".join(wrong)


def test_the_core_packages_import_no_framework_and_nothing_built_on_them():
    banned = ("kedro", "mlflow", *(f"{PACKAGE}.{p}" for p in ABOVE_CORE))
    wrong = [
        f"{modules()[name].relative_to(ROOT)}:{imp.line} imports {imp.target}"
        for name, found in imports().items()
        if any(_within(name, f"{PACKAGE}.{core}") for core in CORE)
        for imp in found
        if any(_within(imp.target, b) for b in banned)
    ]
    assert not wrong, "workflow, workers and tasks stay below the framework:\n" + "\n".join(wrong)


def test_the_generation_engine_imports_nothing_above_it():
    banned = ("kedro", "mlflow", *(f"{PACKAGE}.{p}" for p in (*CORE, *ABOVE_CORE)))
    wrong = [
        f"{modules()[name].relative_to(ROOT)}:{imp.line} imports {imp.target}"
        for name, found in imports().items()
        if _within(name, f"{PACKAGE}.{ENGINE}")
        for imp in found
        if any(_within(imp.target, b) for b in banned)
    ]
    assert not wrong, "generation sits below the packages that generate:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle of each strongly connected group of ``graph`` (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)

    circles = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:  # walk inside the group until a module repeats: that is a circle
            nxt = min(n for n in graph[path[-1]] if n in group)
            if nxt in seen:
                circles.append([*path[path.index(nxt) :], nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return circles


def test_no_module_level_import_circles():
    graph = {
        name: {
            i.target for i in found if i.top_level and i.target in modules() and i.target != name
        }
        for name, found in imports().items()
    }
    circles = _cycles(graph)
    assert not circles, "import circles (break one arrow of each):\n" + "\n".join(
        " -> ".join(circle) for circle in circles
    )


def test_the_circle_finder_names_the_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_function_level_and_relative_imports(tmp_path):
    source = tmp_path / "conductor_pipeline" / "pkg"
    source.mkdir(parents=True)
    module = source / "mod.py"
    module.write_text("from . import other\nimport kedro\n\ndef f():\n    import mlflow\n")
    found = _imports_of("conductor_pipeline.pkg.mod", module)
    assert [(i.target, i.top_level) for i in found] == [
        ("conductor_pipeline.pkg", True),
        ("kedro", True),
        ("mlflow", False),
    ]


def test_registering_the_pipelines_loads_no_model_library():
    """Every `kedro run` registers the pipelines before its first node: the model libraries
    (7 s of imports) load inside the nodes that use them, so a run that cannot start says so
    in seconds."""
    import subprocess
    import sys

    heavy = ("torch", "transformers", "peft", "trl", "litellm")
    code = (
        "import sys\n"
        "from conductor_pipeline.pipeline_registry import register_pipelines\n"
        "register_pipelines()\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_pool_view_of_ask_and_serve_imports_no_statistics_library():
    """`conductor ask` and `conductor serve` import the evaluation package for its view of
    the pool; scipy.stats (0.8 s) loads only where a p-value is computed."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from conductor_pipeline.evaluation.systems import PoolView\n"
        "from conductor_pipeline.evaluation.metrics import mcnemar_exact\n"
        "before = 'scipy.stats' in sys.modules\n"
        "p = mcnemar_exact([True, True, False], [False, False, False])\n"
        "print(before, 'scipy.stats' in sys.modules, round(p, 2))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False True 0.5"
