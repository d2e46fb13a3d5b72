"""The docs against the code: the layout list, the extras table, the replay header size, the published figures.

Each check reads the figure or the list from the docs page and compares it with what the code or the
tree says, so that the page cannot drift from them unnoticed.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: the folders whose every module the layout names, as the docs write them
PACKAGES = {"unilab_gym/": ROOT / "unilab_gym"}


# ----------------------------------------------------------------------------------- layout
def layout_entries(text: str) -> set[str]:
    """The paths named by the code blocks of the "## Layout" section of development.md.

    A line starting at column 0 with a folder (``unilab_gym/``, ``unilab_gym/runtime/``) sets the folder
    of the indented lines below it; an indented line names ``<folder><first word>`` if that word is a
    module (``x.py``), a subpackage (``x/``) or a path of them (``sim/world.py``, which also names
    ``sim/``). Lines that continue a description (indented further, starting with prose) name nothing.
    """
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    entries: set[str] = set()
    for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
        folder = ""
        for line in block.splitlines():
            if not line.strip():
                continue
            words = line.split()
            if not line.startswith(" "):
                folder = words[0] if words[0].endswith("/") else ""
                entries.update(w for w in words if w.endswith("/"))  # examples/  benchmarks/ ...
                continue
            if folder and re.fullmatch(r"[\w/]+(\.py|/)", words[0]):
                path = folder + words[0]
                entries.add(path)
                parts = path.rstrip("/").split("/")[:-1]  # sim/world.py also names sim/
                entries.update("/".join(parts[:k]) + "/" for k in range(1, len(parts) + 1))
    return entries


def tree_entries() -> set[str]:
    """Every module and subpackage under unilab_gym/ (``unilab_gym/sim/world.py``, ``.../sim/``)."""
    out: set[str] = set()
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            relative = path.relative_to(folder)
            if relative.name == "__init__.py" and relative.parent != Path("."):
                out.add(prefix + relative.parent.as_posix() + "/")  # a subpackage is named by its folder
            else:
                out.add(prefix + relative.as_posix())
    return out


def test_the_layout_names_every_module_and_every_name_exists():
    entries = layout_entries((DOCS / "development.md").read_text())
    modules = tree_entries()
    missing = sorted(modules - entries)
    assert not missing, f"docs/development.md's layout does not name {missing}"
    stale = sorted(e for e in entries if not (ROOT / e).exists())
    assert not stale, f"docs/development.md's layout names {stale}, which do not exist"


def test_the_layout_parser_reads_folders_paths_and_continuations():
    text = """## Layout
```
pkg/
  a.py        one line
              more words.py that continue it
  sub/b.py    a path
  sub/        a subpackage
pkg/deep/
  c.py        in the folder above
other/  more/
```
## Next
```
pkg/
  ignored.py  another section
```
"""
    assert layout_entries(text) == {"pkg/", "pkg/a.py", "pkg/sub/b.py", "pkg/sub/", "pkg/deep/", "pkg/deep/c.py"} | {
        "other/",
        "more/",
    }
    deep = "## Layout\n```\npkg/\n  x/y/z.py  deep\n```\n"
    assert layout_entries(deep) == {"pkg/", "pkg/x/", "pkg/x/y/", "pkg/x/y/z.py"}


def named_test_tree(text: str) -> set[str]:
    """The folders and files that the ``tests/`` block of development.md's "## Tests" section names.

    An entry is the first word of a line indented by two spaces (``env/``, ``conftest.py``), as ``tests/<word>``;
    module names in parentheses on any line (``(_runner_common.py)``) are named inside ``tests/helpers/``.
    """
    section = text.split("## Tests", 1)[1].split("\n## ", 1)[0]
    fenced = re.findall(r"^```(\w*)\n(.*?)^```", section, flags=re.S | re.M)
    blocks = [body for language, body in fenced if not language and body.startswith("tests/\n")]
    assert len(blocks) == 1, "development.md's Tests section has no (or more than one) tests/ block"
    entries = {"tests/" + line.split()[0] for line in blocks[0].splitlines() if re.match(r"  \S", line)}
    entries.update("tests/helpers/" + name for name in re.findall(r"\b(_\w+\.py)\b", blocks[0]))
    return entries


def test_the_test_tree_in_the_docs_names_every_folder_and_every_name_exists():
    tests = ROOT / "tests"
    entries = named_test_tree((DOCS / "development.md").read_text())
    folders = {f"tests/{p.name}/" for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    missing = sorted(folders - entries)
    assert not missing, f"docs/development.md's test tree does not name {missing}"
    stale = sorted(e for e in entries if not (ROOT / e).exists())
    assert not stale, f"docs/development.md's test tree names {stale}, which do not exist"
    loose = sorted(p.name for p in tests.glob("*.py") if p.name != "conftest.py")
    assert not loose, f"test files belong in a folder of the test tree, not at tests/: {loose}"


def test_the_test_tree_parser_reads_folders_files_and_helper_modules():
    text = "## Tests\n```bash\npytest\n```\n```\ntests/\n  a/   one\n       more (_x.py) words\n  c.py  file\n```\n"
    text += "## Next\n```\ntests/\n  b/\n```\n"
    assert named_test_tree(text) == {"tests/a/", "tests/c.py", "tests/helpers/_x.py"}


def test_the_development_page_quotes_no_test_count():
    text = (DOCS / "development.md").read_text()
    assert not re.search(r"\(\d[\d,]* tests\)", text), "a test count goes stale: leave it out"


# ----------------------------------------------------------------------------------- extras
def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_the_install_page_lists_every_extra_and_its_packages():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rows = {
        m.group(1): m.group(2).lower()
        for m in re.finditer(r"^\| `([\w-]+)` \| ([^|]*) \|", (DOCS / "install.md").read_text(), flags=re.M)
    }
    assert sorted(rows) == sorted(extras), "docs/install.md's extras table and pyproject.toml differ"
    for extra, requirements in extras.items():
        for requirement in requirements:
            name = _requirement_name(requirement)
            if name == "unilab-gym":  # an extra of extras: "all of the above"
                continue
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", rows[extra]), (
                f"docs/install.md: the {extra!r} row does not name {name}"
            )


# ----------------------------------------------------------------------------------- replay header
def _ring_module():
    """The module that lays out the segment (``_HEADER_BYTES``, ``_layout_record``): ring.py, storage.py before it."""
    import importlib

    for name in ("unilab_gym.replay.ring", "unilab_gym.replay.storage"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(module, "_HEADER_BYTES") and hasattr(module, "_layout_record"):
            return module
    pytest.fail("no replay module defines _HEADER_BYTES and _layout_record: update this test")


def test_the_replay_page_quotes_the_header_and_record_sizes_of_the_code():
    from unilab_gym.replay import ReplayLayout

    storage = _ring_module()

    text = " ".join((DOCS / "replay.md").read_text().split())
    header = re.search(r"(\d[\d,]*)-byte header", text)
    assert header and int(header.group(1).replace(",", "")) == storage._HEADER_BYTES
    sizes = re.search(
        r"`ReplayLayout\((\d+), (\d+)\)` at ([\d,]+) rows the record is (\d+) bytes, "
        r"so the segment \(`ReplayStorage.nbytes`\) is ([\d,]+) bytes larger than its rows",
        text,
    )
    assert sizes, "docs/replay.md no longer states the layout record's size"
    obs, act, rows, record, extra = (int(g.replace(",", "")) for g in sizes.groups())
    expected = len(storage._layout_record(ReplayLayout(obs, act), rows))  # what ReplayStorage writes
    assert (record, extra) == (expected, storage._HEADER_BYTES + expected)


def test_the_overhead_is_what_a_segment_measures():
    """The sum the docs quote is the segment's size minus its rows (a small ring: same header, same record rule)."""
    from unilab_gym.replay import ReplayLayout, ReplayStorage

    storage = _ring_module()
    layout = ReplayLayout(48, 12)
    ring = ReplayStorage(layout, 1000)
    try:
        assert ring.nbytes - 1000 * layout.row_nbytes == storage._HEADER_BYTES + len(
            storage._layout_record(layout, 1000)
        )
    finally:
        ring.close()


# ----------------------------------------------------------------------------------- figures
def _benchmarks_common():
    spec = importlib.util.spec_from_file_location("_benchmarks_common", ROOT / "benchmarks" / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMMON = _benchmarks_common()


@pytest.mark.parametrize("source, name", sorted(COMMON.DOCS_FIGURES.items()))
def test_every_published_figure_is_the_current_one_and_shown(source, name):
    copy, original = DOCS / "assets" / name, ROOT / "benchmarks" / "results" / source
    assert copy.read_bytes() == original.read_bytes(), (
        f"docs/assets/{name} is not benchmarks/results/{source}: copy it again (docs/development.md)"
    )
    pages = [p.name for p in DOCS.glob("*.md") if f"(assets/{name})" in p.read_text()]
    assert pages, f"no docs page shows assets/{name}"


def test_publish_figure_copies_only_the_committed_figures(tmp_path):
    results, assets = tmp_path / "results", tmp_path / "assets"
    (results / "sac_async").mkdir(parents=True)
    figure = results / "sac_async" / "sac_async.png"
    figure.write_bytes(b"png")
    other = results / "other.png"
    other.write_bytes(b"x")
    copy = COMMON.publish_figure(str(figure), results_dir=str(results), assets_dir=str(assets))
    assert copy == str(assets / "sac_async.png") and (assets / "sac_async.png").read_bytes() == b"png"
    assert COMMON.publish_figure(str(other), results_dir=str(results), assets_dir=str(assets)) is None
    elsewhere = tmp_path / "runs" / "compare_sb3.png"  # a run outside the committed results
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"y")
    assert COMMON.publish_figure(str(elsewhere), results_dir=str(results), assets_dir=str(assets)) is None
    assert sorted(p.name for p in assets.iterdir()) == ["sac_async.png"]


def test_the_return_plot_draws_each_repeat_as_its_own_line_in_time_order():
    """Two seeds of one configuration, their points given out of order: two lines, each in time order."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import compare_sb3
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import matplotlib.pyplot as plt

    runs = [
        {"env_steps_per_s": 10.0, "curve": [[3.0, 300, 0.3], [1.0, 100, 0.1], [2.0, 200, 0.2]]},
        {"env_steps_per_s": 12.0, "curve": [[2.5, 200, 0.5], [0.5, 100, 0.4]]},
    ]
    report = {"sections": {"sac": {"runs": {"stock": runs}}}, "machine": {"cpu": "x", "cores": 2}, "date": "d"}
    fig = compare_sb3.figure(report)
    try:
        ax = fig.axes[-1]  # the return panel
        drawn = [line for line in ax.get_lines() if len(line.get_xdata())]
        assert [list(line.get_xdata()) for line in drawn] == [[1.0, 2.0, 3.0], [0.5, 2.5]]
        assert [list(line.get_ydata()) for line in drawn] == [[0.1, 0.2, 0.3], [0.4, 0.5]]
        assert len({line.get_linestyle() for line in drawn}) == 2  # the seeds can be told apart
    finally:
        plt.close(fig)
