"""No module of the package reaches into another's private members (issue 28, "declared seams").

The scan reads every ``unilab_gym/**/*.py`` on disk (so it follows files that move) and reports:

- ``x._name``: an attribute access whose name is private (one leading underscore, not a dunder) where ``x``
  is not ``self`` / ``cls`` and the module does not define ``_name`` itself (a method, a class attribute,
  a ``self._name = ...`` or a module-level name): it reaches into another module's object.
- ``getattr(x, "_name")`` / ``setattr`` / ``hasattr`` / ``delattr`` with such a name: the same reach, spelled
  as a string.
- ``from module import _name`` of a private *name* (a private *module*, such as ``unilab_gym._deprecated``,
  is the package's own and may be imported).

SB3's private API (``_setup_learn``, ``_dump_logs``, ``_episode_num``, ...) is such a reach too: it is allowed
only in ``unilab_gym/sb3/_sb3_private.py``, the one module that gathers it (issue 28, "Done when").

``ALLOWED`` lists what remains, each entry ``(path, name)`` with who owns the fix; the test also fails on an
entry that no longer occurs, so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "unilab_gym"

#: Modules that may reach into private members: the one home of SB3's private API calls.
EXEMPT_MODULES = {"unilab_gym/sb3/_sb3_private.py"}

#: Private names of the standard library that are its documented API, or the only way to do a thing.
STDLIB = {
    ("os", "_exit"),  # exit without interpreter teardown (a forked / spawned child), documented in os
    ("sys", "_getframe"),  # CPython's frame access, documented in sys
}
#: Underscored names that are public API: a namedtuple's methods (underscored so as not to clash with fields).
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make"}

#: Reaches into a *third-party* private member for which no public API exists (not ours to fix), with why.
NO_PUBLIC_API: set[tuple[str, str]] = {
    # CPython's fork server hands its "alive" pipe to every child; the collector must close it to die with
    # the learner (die_with_parent): no public API gives that fd
    ("unilab_gym/runtime/collector.py", "_forkserver"),
    ("unilab_gym/runtime/collector.py", "_forkserver_alive_fd"),
    # ray.get's two steps (fetch, deserialize) timed apart for the ingest metrics; falls back to ray.get
    ("unilab_gym/runtime/ray_pool.py", "_private"),
    # multiprocessing's current_process()._inheriting: True only while a spawned child imports the main script
    # (multiprocessing.spawn's own "is this bootstrapping?" test); the public alternatives (parent_process(),
    # __main__ named __mp_main__) also hold after the bootstrap, so they would refuse a runner a worker process
    # builds on purpose
    ("unilab_gym/sb3/runner.py", "_inheriting"),
    # Tianshou's ReplayBuffer keeps its write position in _insertion_idx, with no public accessor (last_index is
    # the last write, 0 when empty); the pickled state's checksum covers it, as it has since 0.1 (saved states load)
    ("unilab_gym/tianshou/replay_buffer.py", "_insertion_idx"),
}

#: What remains to fix, ``(path, name)``, by owner (issue 28). Shrink it: the test fails on an entry that no
#: longer occurs. Empty: the replay ring's header table (replay/ring.py), sampling's MAX_SAMPLE_ROUNDS and
#: storage's as_column are public seams, and a Tianshou sub-buffer's size is read with len().
ALLOWED: set[tuple[str, str]] = set()


def _module_names(tree: ast.Module) -> set[str]:
    """The private names a module defines itself: functions, classes, class attributes, ``self._n = ...`` targets,
    module-level assignments and imports (those are its own to use)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                    elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        names.add(sub.attr)  # self._n = ...: its own (other._n = ... is a reach, not a definition)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _private(n)}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_"


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of this repository (a private module is the package's own)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _reaches(path: Path) -> list[tuple[int, str, str]]:
    """``(line, name, what)`` for every reach into a private member that ``path`` makes."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _module_names(tree)
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own | PUBLIC_UNDERSCORED:
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Name) and (base.id, node.attr) in STDLIB:
                continue
            found.append((node.lineno, node.attr, f"{ast.unparse(node)}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            base, name = node.args[0], node.args[1].value
            if isinstance(base, ast.Name) and (base.id in ("self", "cls") or (base.id, name) in STDLIB):
                continue
            found.append((node.lineno, name, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if _private(alias.name) and not _is_module(f"{node.module}.{alias.name}"):
                    found.append((node.lineno, alias.name, f"from {node.module} import {alias.name}"))
    return found


@functools.cache
def _scan() -> dict[tuple[str, str], list[str]]:
    """Every reach of the package, by ``(path, name)``: the ``path:line: code`` of each occurrence.

    Parsed once per run: CPython 3.11.7's ``ast.parse`` can raise ``SystemError: AST constructor recursion depth
    mismatch`` late in a long suite (gh-106905, fixed in 3.11.8), and the tree does not change during a run.
    """
    hits: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in EXEMPT_MODULES:
            continue
        for line, name, code in _reaches(path):
            hits.setdefault((rel, name), []).append(f"{rel}:{line}: {code}")
    return hits


def test_no_module_reaches_into_another_modules_private_members():
    hits = _scan()
    known = ALLOWED | NO_PUBLIC_API
    new = [where for key, wheres in sorted(hits.items()) if key not in known for where in wheres]
    assert not new, "private members reached from another module (declare a public seam instead):\n" + "\n".join(new)


def test_the_allowlist_only_names_reaches_that_still_occur():
    stale = sorted((ALLOWED | NO_PUBLIC_API) - set(_scan()))
    assert not stale, f"remove these entries from ALLOWED in tests/tools/test_private_access.py (fixed): {stale}"


def test_the_scan_finds_each_kind_of_reach(tmp_path):
    source = (
        "from other import _hidden\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, b):\n"
        "        b._set = 2\n"
        "        return self._mine, b._mine, b._theirs, getattr(b, '_also'), b.__class__\n"
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    assert sorted((line, name) for line, name, _ in _reaches(path)) == [
        (1, "_hidden"),
        (6, "_set"),
        (7, "_also"),
        (7, "_theirs"),
    ]
