"""The layering, checked on the source: packages import downward only (no cycles), compiling (engine/)
does not know the repository, click stays in cli/, and one module reads manifest.json."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TOOLKIT = Path(__file__).resolve().parent.parent / "toolkit"


def _unit(path: Path) -> str:
    """A package under toolkit/ (api, engine, ...) or a top-level module (build, settings, ...)."""
    parts = path.relative_to(TOOLKIT).parts
    return parts[0].removesuffix(".py")


def _imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _sources() -> dict[Path, ast.AST]:
    return {path: ast.parse(path.read_text()) for path in sorted(TOOLKIT.rglob("*.py"))}


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path, tree in _sources().items():
        unit = _unit(path)
        for module in _imports(tree):
            parts = module.split(".")
            if parts[0] == "toolkit" and len(parts) > 1 and parts[1] != unit:
                edges[unit].add(parts[1])
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_between_packages():
    edges = _graph()
    assert edges["cli"], "the graph is empty: the test reads nothing"
    assert _cycle(edges) is None, f"import cycle: {' -> '.join(_cycle(edges))}"


def test_a_cycle_would_be_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_compiling_does_not_know_the_repository():
    assert "repository" not in _graph()["engine"]


def test_only_the_cli_imports_click_and_nothing_imports_the_cli():
    for path, tree in _sources().items():
        if _unit(path) != "cli":
            assert "click" not in {m.split(".")[0] for m in _imports(tree)}, path
            assert not any(
                m == "toolkit.cli" or m.startswith("toolkit.cli.") for m in _imports(tree)
            ), path


def test_one_module_names_manifest_json():
    """Everything else asks repository.reader (open_repository, MANIFEST)."""
    naming = set()
    for path, tree in _sources().items():
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "manifest.json" in node.value
                and id(node) not in docstrings
                and not node.value.count(" ")  # a file name, not a message that mentions it
            ):
                naming.add(path.relative_to(TOOLKIT).as_posix())
    assert naming == {"repository/reader.py"}


# --- the target seam: what differs by target lives in toolkit/targets/ ----------------------------
def _target_words() -> set[str]:
    from toolkit.targets import TARGET_NAMES

    return {*TARGET_NAMES, "gpu", "tensorrtllm"}


_TARGET_CLASSES = {
    "CpuEngine",
    "SyntheticEngine",
    "TrtllmEngine",
    "PythonEngine",
    "CpuTarget",
    "SyntheticTarget",
    "GpuTarget",
    "PythonTarget",
}


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _strings_in(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _target_branches(tree: ast.AST, words: set[str]) -> list[str]:
    """Comparisons with a target's name (==, !=, in), isinstance checks on a target's classes, and
    match cases on a target's name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            hit = (
                _strings_in(node.left) | set().union(*map(_strings_in, node.comparators))
            ) & words
            if hit:
                found.append(f"line {node.lineno}: compares with {sorted(hit)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
            and _names_in(node.args[1]) & _TARGET_CLASSES
        ):
            found.append(
                f"line {node.lineno}: isinstance on {sorted(_names_in(node.args[1]) & _TARGET_CLASSES)}"
            )
        elif isinstance(node, ast.match_case) and _strings_in(node.pattern) & words:
            found.append(
                f"line {node.pattern.lineno}: matches {sorted(_strings_in(node.pattern) & words)}"
            )
    return found


def test_no_module_outside_the_targets_package_branches_on_a_target():
    words = _target_words()
    branches = {
        path.relative_to(TOOLKIT).as_posix(): found
        for path, tree in _sources().items()
        if _unit(path) != "targets" and (found := _target_branches(tree, words))
    }
    assert branches == {}


def test_a_branch_on_a_target_would_be_found():
    code = ast.parse(
        "if repo.target == 'cpu': pass\n"
        "x = isinstance(engine, TrtllmEngine)\n"
        "y = kind in ('synthetic', 'other')\n"
        "match target:\n    case 'h100-sxm': pass\n"
    )
    assert len(_target_branches(code, _target_words())) == 4


def test_the_python_engines_branch_on_no_target_either():
    """The repository's Python models are told what to refuse (their `refusals` parameter); they
    never ask which target they were built for."""
    words = _target_words()
    model_repo = TOOLKIT.parent / "model_repo"
    branches = {
        path.relative_to(model_repo).as_posix(): found
        for path in sorted(model_repo.rglob("*.py"))
        if (found := _target_branches(ast.parse(path.read_text()), words))
    }
    assert branches == {}
