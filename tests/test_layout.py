"""The package's import graph: no cycles, and no module imports the package face for a side effect."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: source folder -> the dotted package it is installed as
PACKAGES = {ROOT / "unilab_gym": "unilab_gym"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, dotted in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([dotted, *parts])] = path
    return out


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every package module that ``module`` imports, at module level or inside functions (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    skip = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _type_checking_only(node)
        for n in ast.walk(node)
    }
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {name for name in found if name in modules and name != module}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycles_inside_the_package():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_function_level_and_relative_imports(tmp_path):
    modules = {"unilab_gym.a": tmp_path / "a.py", "unilab_gym.b": tmp_path / "b.py"}
    modules["unilab_gym.a"].write_text("def f():\n    from unilab_gym.b import g\n")
    modules["unilab_gym.b"].write_text("from . import a\n")
    assert _imports("unilab_gym.a", modules["unilab_gym.a"], modules) == {"unilab_gym.b"}
    assert _imports("unilab_gym.b", modules["unilab_gym.b"], modules) == {"unilab_gym.a"}


def test_no_module_imports_the_package_face():
    graph = _graph()
    offenders = sorted(name for name, deps in graph.items() if "unilab_gym" in deps)
    assert offenders == [], f"these modules import the package face `unilab_gym`: {offenders}"


def test_console_script_lists_the_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "unilab_gym", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in ("robustness", "play"):
        assert name in out


def test_console_script_passes_options_to_the_subcommand():
    proc = subprocess.run([sys.executable, "-m", "unilab_gym", "play", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "usage: unilab-gym play" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "unilab_gym", "no-such-tool"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


@pytest.mark.parametrize("module", ["unilab_gym.robustness", "unilab_gym.cli.robustness"])
def test_robustness_module_entry_points_keep_working(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: unilab-gym robustness" in out
