"""The shape of the code, read from the source itself: only the objectives registry knows objectives by name, and the
import graph of the project (function-local imports included) has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

from finetune import objectives

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "finetune" / "objectives" / "__init__.py"
# What names an objective: the config's `objective` values and `task` values (classification is a task).
OBJECTIVE_WORDS = {*objectives.CHOICES, *objectives.TASKS}
TESTED_ATTRIBUTES = {"objective", "task"}  # a comparison with one of these decides by an objective's name
RETIRED_NAMES = {"PREFERENCE_OBJECTIVES", "OBJECTIVE_NAMES", "OBJECTIVE_WORDS", "GOAL_SETTINGS"}


def sources() -> list[Path]:
    """Every Python file of the product: the backend, the UI and the app."""
    return sorted([*(ROOT / "finetune").rglob("*.py"), *(ROOT / "ui").rglob("*.py"), ROOT / "app.py"])


def objective_name_tests(path: Path) -> list[str]:
    """Where a file names an objective or a task, or decides by comparing `.objective` / `.task`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OBJECTIVE_WORDS:
            found.append(f"{where}: the string {node.value!r}")
        elif isinstance(node, ast.Compare) and _decides_by_name(node):
            found.append(f"{where}: a comparison of {ast.unparse(node)}")
        elif isinstance(node, (ast.Name, ast.alias)) and (getattr(node, "id", None) or node.name) in RETIRED_NAMES:
            found.append(f"{where}: {getattr(node, 'id', None) or node.name}")
    return found


def _decides_by_name(node: ast.Compare) -> bool:
    """A comparison of `.objective` / `.task` with something (`is None` checks decide nothing by name)."""
    if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
        return False
    return any(_tested(x) for x in [node.left, *node.comparators])


def _tested(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in TESTED_ATTRIBUTES) or (
        isinstance(node, ast.Name) and node.id in TESTED_ATTRIBUTES
    )


def test_nothing_outside_the_registry_tests_objective_names():
    offenders = [line for path in sources() if path != REGISTRY for line in objective_name_tests(path)]
    assert not offenders, "objective names tested outside finetune/objectives/:\n" + "\n".join(offenders)


def test_the_grep_sees_an_objective_name_test(tmp_path):
    """The check itself catches each way of deciding by name (a test that cannot fail proves nothing)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        'if config.objective != "sft": pass\n'
        "if plan.task in WHATEVER: pass\n"
        'kinds = ("dpo",)\n'
        "from finetune.config import PREFERENCE_OBJECTIVES\n",
        encoding="utf-8",
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = objective_name_tests(sample)
    finally:
        ROOT = saved
    assert len(found) == 5, found  # the comparison and its "sft", the `in` test, "dpo", the import


# ----------------------------------------------------------------------------- the import graph
def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (top level or inside functions). `from P import
    x` counts as importing P.x when that is a module, else P."""
    modules = {module_name(path): path for path in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in modules:
                        edges.add(target)
                    elif base in modules:
                        edges.add(base)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_has_no_cycle_function_local_imports_included():
    graph = import_graph()
    assert "finetune.cli.launch" in graph["finetune.cli"]  # the graph sees function-local imports (cli's are)
    assert not cycles(graph), cycles(graph)


def command_line_reached(graph: dict[str, set[str]], paths: list[Path]) -> list[str]:
    """Where a backend module (finetune/ outside cli/ and `python -m finetune`'s entry) imports the command line, or
    parses arguments itself with argparse."""
    backend = {
        module_name(path): path
        for path in paths
        if module_name(path).partition(".")[0] == "finetune"
        and not module_name(path).startswith(("finetune.cli", "finetune.__main__"))
    }
    found = [f"{name} -> {target}" for name in backend for target in graph[name] if target.startswith("finetune.cli")]
    for name, path in backend.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            imported = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            imported += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{name} -> argparse" for module in imported if module.partition(".")[0] == "argparse"]
    return sorted(found)


def test_argument_parsing_lives_only_in_the_cli_package():
    """The backend offers functions; finetune/cli/ parses the flags, prints and picks exit codes. A backend module
    that registers a sub-command or imports the CLI's helpers brings the two back together (and an import circle)."""
    graph = import_graph()
    assert "finetune.runs.launch" in graph["finetune.cli.launch"]  # (the check sees the CLI calling the backend)
    reached = command_line_reached(graph, sources())
    assert not reached, "command-line parsing outside finetune/cli/:\n" + "\n".join(reached)


# The studio, the config schema, the errors and the objectives registry (light: no torch, no gradio).
UI_DOORS = {"finetune.studio", "finetune.config", "finetune.errors", "finetune.objectives"}


def test_the_ui_imports_only_the_studio_the_config_schema_the_errors_and_the_registry():
    graph = import_graph()
    assert "finetune.studio" in graph["ui.app"]  # (the check sees the UI's imports)
    reached = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.partition(".")[0] == "ui"
        for target in targets
        if target.partition(".")[0] == "finetune" and target not in UI_DOORS
    )
    assert not reached, "the UI reaches past its doors:\n" + "\n".join(reached)


def test_the_ui_reads_the_registry_itself_not_through_the_studio():
    """Each door is used openly: nothing the UI takes from the studio is a module the studio imported (a registry
    passed through), and the UI does import the registry."""
    import types

    from finetune import studio

    passed = sorted(
        f"{path.relative_to(ROOT)}: {alias.name}"
        for path in sorted((ROOT / "ui").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module == "finetune.studio"
        for alias in node.names
        if isinstance(getattr(studio, alias.name, None), types.ModuleType)
    )
    assert not passed, "modules the UI takes through the studio:\n" + "\n".join(passed)
    assert "finetune.objectives" in import_graph()["ui.start_tab"]


def test_the_registry_and_the_event_reader_load_without_torch_or_gradio():
    """What the UI imports besides the studio stays light: the registry and the typed event log load alone."""
    import subprocess
    import sys

    code = (
        "import sys, finetune.objectives, finetune.config, finetune.runs.events; "
        "print(sorted(m for m in ('torch', 'transformers', 'gradio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_cycle_check_finds_a_cycle_through_a_function_local_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
