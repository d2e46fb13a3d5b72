"""The package's import graph: no cycles, no module imports the package face, and the framework wings.

The wings (issue 28): ``unilab_gym/sb3/`` is the only folder that imports ``stable_baselines3`` and
``unilab_gym/tianshou/`` the only one that imports ``tianshou``; the transport (``runtime/``), the
replay and the env never import a framework, and the two wings never import each other. The old
import paths are re-export shims that warn.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def _external_imports(path: Path) -> set[str]:
    """Top-level names of the packages outside ``unilab_gym`` that ``path`` imports (TYPE_CHECKING excluded)."""
    tree = ast.parse(path.read_text())
    skip = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _type_checking_only(node)
        for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"unilab_gym"}


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


# ----------------------------------------------------------------------------------- framework wings
FRAMEWORKS = {"stable_baselines3": "unilab_gym.sb3", "tianshou": "unilab_gym.tianshou"}
#: the framework-free core: the transport, the replay and the env
CORE = (
    "unilab_gym.runtime",
    "unilab_gym.replay",
    "unilab_gym.vector_env",
    "unilab_gym.envs",
    "unilab_gym.envs_",
    "unilab_gym.sim",
    "unilab_gym.tasks",
    "unilab_gym.robots",
    "unilab_gym.adapters",
)
#: modules outside the wings that still import SB3 directly: none. The tools and the exporter load saved models,
#: their VecNormalize statistics and their actors through unilab_gym.sb3.models (issue 28).
SB3_OUTSIDE_THE_WING: set[str] = set()


def _in(module: str, package: str) -> bool:
    return (
        module == package or module.startswith(package + ".") or (package.endswith("_") and module.startswith(package))
    )


def test_only_the_wings_import_their_framework():
    modules = _modules()
    offenders: dict[str, set[str]] = {}
    for name, path in modules.items():
        for framework, wing in FRAMEWORKS.items():
            if framework in _external_imports(path) and not _in(name, wing):
                offenders.setdefault(framework, set()).add(name)
    assert offenders.get("tianshou", set()) == set(), f"tianshou imported outside unilab_gym/tianshou/: {offenders}"
    unexpected = sorted(offenders.get("stable_baselines3", set()) - SB3_OUTSIDE_THE_WING)
    assert not unexpected, f"stable_baselines3 imported outside unilab_gym/sb3/: {unexpected}"


def test_the_core_imports_no_framework_and_no_wing():
    modules = _modules()
    graph = _graph()
    bad = []
    for name, path in modules.items():
        if not any(_in(name, core) for core in CORE):
            continue
        frameworks = _external_imports(path) & set(FRAMEWORKS)
        wings = {dep for dep in graph[name] if any(_in(dep, w) for w in FRAMEWORKS.values())}
        if frameworks or wings:
            bad.append(f"{name} imports {sorted(frameworks | wings)}")
    assert not bad, "the framework-free core imports a framework: " + "; ".join(bad)


def test_the_two_wings_never_import_each_other():
    graph = _graph()
    sb3, ts = FRAMEWORKS["stable_baselines3"], FRAMEWORKS["tianshou"]
    crossing = sorted(
        f"{name} -> {dep}"
        for name, deps in graph.items()
        for dep in deps
        if (_in(name, sb3) and _in(dep, ts)) or (_in(name, ts) and _in(dep, sb3))
    )
    assert not crossing, f"the wings import each other: {crossing}"


def test_the_wing_checks_see_function_level_framework_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tianshou\n"
        "def f():\n    from stable_baselines3.common import utils\n"
    )
    assert _external_imports(path) == {"typing", "stable_baselines3"}


def test_import_unilab_gym_and_the_wing_faces_stay_light():
    code = (
        "import sys, unilab_gym, unilab_gym.sb3, unilab_gym.tianshou\n"
        "heavy = sorted(m for m in ('torch', 'stable_baselines3', 'tianshou') if m in sys.modules)\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_the_wing_faces_export_their_names():
    from unilab_gym.sb3 import AsyncRunner, SB3VecEnv, SharedReplayBuffer, make_sb3_env
    from unilab_gym.tianshou import SharedVectorReplayBuffer, TianshouVectorEnv, make_tianshou_env

    assert AsyncRunner.__module__ == "unilab_gym.sb3.runner"
    assert SharedReplayBuffer.__module__ == "unilab_gym.sb3.replay_buffer"
    assert SB3VecEnv.__module__ == make_sb3_env.__module__ == "unilab_gym.sb3.vec_env"
    assert TianshouVectorEnv.__module__ == make_tianshou_env.__module__ == "unilab_gym.tianshou.venv"
    assert SharedVectorReplayBuffer.__module__ == "unilab_gym.tianshou.replay_buffer"
    import unilab_gym

    assert unilab_gym.AsyncRunner is AsyncRunner and unilab_gym.SharedReplayBuffer is SharedReplayBuffer


# ----------------------------------------------------------------------------------- deprecated paths
#: old path -> (a name it exported, the module that defines it now)
OLD_PATHS = {
    "unilab_gym.integrations.sb3": ("make_sb3_env", "unilab_gym.sb3.vec_env"),
    "unilab_gym.integrations.sb3_replay": ("SharedReplayBuffer", "unilab_gym.sb3.replay_buffer"),
    "unilab_gym.integrations.sb3_policies": ("AsymmetricSACPolicy", "unilab_gym.sb3.policies"),
    "unilab_gym.integrations.tianshou": ("SharedVectorReplayBuffer", "unilab_gym.tianshou"),
    "unilab_gym.control": ("Controller", "unilab_gym.sb3.control"),
    "unilab_gym.control.callback": ("ControlCallback", "unilab_gym.sb3.control.callback"),
    "unilab_gym.control.controller": ("Controller", "unilab_gym.sb3.control.controller"),
    "unilab_gym.control.hyperparams": ("HYPERPARAMETERS", "unilab_gym.sb3.control.hyperparams"),
    "unilab_gym.control.server": ("ControlServer", "unilab_gym.sb3.control.server"),
    "unilab_gym.control.snapshots": ("SnapshotStore", "unilab_gym.sb3.control.snapshots"),
    "unilab_gym.runtime.runner": ("AsyncRunner", "unilab_gym.sb3.runner"),
    "unilab_gym.hyperparams": ("path", "unilab_gym.sb3.zoo"),
}


def test_every_shim_is_listed():
    from unilab_gym._deprecated import MOVED

    assert {old: new for old, (_, new) in OLD_PATHS.items()} == MOVED


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_every_old_import_path_warns_and_resolves_to_the_same_object(old):
    name, new = OLD_PATHS[old]
    for module in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        del sys.modules[module]  # import it afresh: the warning comes at import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shim = importlib.import_module(old)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(old in m and new in m for m in messages), messages
    assert getattr(shim, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match="no attribute"):
        shim.no_such_name


def test_a_pickle_naming_the_old_class_paths_still_loads():
    import pickle

    from unilab_gym.sb3.policies import AsymmetricSACPolicy
    from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

    # what SB3's cloudpickle wrote into the zips of 0.1 (policy_class, replay_buffer_class): references by path
    old = b"cunilab_gym.integrations.sb3_replay\nSharedReplayBuffer\n."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert pickle.loads(old) is SharedReplayBuffer
        assert pickle.loads(b"cunilab_gym.integrations.sb3_policies\nAsymmetricSACPolicy\n.") is AsymmetricSACPolicy
