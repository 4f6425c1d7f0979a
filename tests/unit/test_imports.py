"""The package's imports form a directed acyclic graph (docs/architecture.md): read from the
source with `ast`, every import counted, at module level or inside a function.

A submodule's implicit import of its own package does not count (Python loads the parent
first, whatever the code says); a package's __init__ importing its submodules does. Nor does
an import under `if TYPE_CHECKING:`: it names a type for annotations and never runs.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[2] / "paddle_dist"


def module_files(root: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package at `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph(root: Path) -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports."""
    files = module_files(root)
    graph: Dict[str, Set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        skipped = typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from a import b`: the submodule a.b if there is one, else a itself.
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in files else source
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:      # import a.b.c where c is a name
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(f"{target}."):
                    graph[name].add(target)
    return graph


def typing_only(tree: ast.AST) -> Set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    found: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Each import cycle once, as a path that starts and ends at the same module."""
    found, done, path, seen = [], set(), [], set()

    def visit(node):
        path.append(node)
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycle = path[path.index(nxt):] + [nxt]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    found.append(cycle)
            elif nxt not in done:
                visit(nxt)
        path.pop()
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start)
    return found


def test_the_package_imports_have_no_cycle():
    found = cycles(import_graph(PACKAGE))
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_a_cycle_is_found_and_named(tmp_path):
    """The check can fail: a small package whose a imports b (inside a function) and b
    imports a."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("def f():\n    from .b import g\n")
    (package / "b.py").write_text("from pkg import a\n\ndef g():\n    pass\n")
    (package / "c.py").write_text("import pkg.b\n")
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_an_import_for_annotations_only_is_no_edge(tmp_path):
    """b imports a; a names b's type under `if TYPE_CHECKING:` only, which never runs."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
                                  "def f(b: 'B'):\n    pass\n")
    (package / "b.py").write_text("from . import a\nclass B:\n    pass\n")
    assert import_graph(package) == {"pkg": set(), "pkg.a": set(), "pkg.b": {"pkg.a"}}


def test_command_lines_are_imported_by_no_library_module():
    """The `python -m` entry points' command lines (train.py, the packages' __main__) sit at the top."""
    graph = import_graph(PACKAGE)
    entries = {"paddle_dist.train"} | {name for name in graph if name.endswith("__main__")}
    importers = {name: sorted(n for n, targets in graph.items() if name in targets and n not in entries)
                 for name in entries}
    assert {name: found for name, found in importers.items() if found} == {}


# ---------------------------------------------------------------- the layers (docs/architecture.md)
# What a rank runs: its entry point, the trainer, and who it is (runtime/). The parent side
# (the launcher and the doctor) starts and watches ranks; no rank ever needs its code.
RANK_ENTRIES = ("paddle_dist.worker", "paddle_dist.trainer", "paddle_dist.runtime")
PARENT_SIDE = ("paddle_dist.launch", "paddle_dist.doctor")
# Imported by launchers before any rank starts, or by commands that never train: no paddle
# (about a second to import) at module level.
PADDLE_FREE = ("paddle_dist.launch", "paddle_dist.runs", "paddle_dist.security", "paddle_dist.doctor")
# The doctor's rank side: what a self-test rank runs, imported inside its functions only.
DOCTOR_RANK_SIDE = ("paddle_dist.doctor.checks", "paddle_dist.doctor.checks_amp")
# Faces that import their paddle modules lazily, and the shared-memory transport.
PADDLE_FREE_MODULES = ("paddle_dist.runtime", "paddle_dist.trainer", "paddle_dist.sync", "paddle_dist.sync.shm",
                       "paddle_dist.sync.transports", "paddle_dist.data.registry", "paddle_dist.runs.layout")
MAX_LINES = 400          # a module
MAX_FACE_LINES = 40      # a package's __init__.py: a docstring, re-exports, __all__


def reachable(graph: Dict[str, Set[str]], roots) -> Set[str]:
    """Every module that importing the modules named by `roots` (or inside them) can import."""
    todo = [name for name in graph if any(name == r or name.startswith(f"{r}.") for r in roots)]
    seen: Set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def parent_side_reached(graph: Dict[str, Set[str]], entries=RANK_ENTRIES, parent=PARENT_SIDE) -> List[str]:
    return sorted(n for n in reachable(graph, entries) if any(n == p or n.startswith(f"{p}.") for p in parent))


def importing_paddle(modules: List[str], path: Path) -> List[str]:
    """The modules among `modules` whose import loads `paddle`, imported one after another
    in one fresh interpreter with `path` first on sys.path: the first that does, or []."""
    probe = ("import importlib, sys\n"
             "for name in sys.argv[1:]:\n"
             "    importlib.import_module(name)\n"
             "    if 'paddle' in sys.modules:\n"
             "        sys.exit(print(name) or 3)\n")
    done = subprocess.run([sys.executable, "-c", probe, *modules], cwd=path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(path)})
    assert done.returncode in (0, 3), done.stderr
    return done.stdout.split()


def test_the_rank_side_never_imports_the_parent_side():
    """A rank imports neither the launcher nor the doctor, even inside a function."""
    assert parent_side_reached(import_graph(PACKAGE)) == []


def test_a_rank_module_reaching_the_launcher_is_found(tmp_path):
    """The check can fail: worker -> runtime.process -> (in a function) launch.supervisor."""
    graph = {"p.worker": {"p.runtime.process"}, "p.runtime.process": {"p.launch.supervisor"},
             "p.launch.supervisor": set(), "p.launch": set()}
    assert parent_side_reached(graph, ("p.worker",), ("p.launch",)) == ["p.launch.supervisor"]


def test_the_launcher_side_and_the_lazy_faces_import_no_paddle():
    modules = sorted(n for n in import_graph(PACKAGE) if n not in DOCTOR_RANK_SIDE and (
                     any(n == p or n.startswith(f"{p}.") for p in PADDLE_FREE) or n in PADDLE_FREE_MODULES))
    assert len(modules) > 30
    assert importing_paddle(modules, PACKAGE.parent) == []


def test_a_module_importing_paddle_is_found(tmp_path):
    """The check can fail: a stand-in `paddle` package imported by one module of two."""
    (tmp_path / "paddle").mkdir()
    (tmp_path / "paddle" / "__init__.py").write_text("")
    (tmp_path / "clean.py").write_text("import json\n")
    (tmp_path / "heavy.py").write_text("import paddle\n")
    (tmp_path / "later.py").write_text("import heavy\n")
    assert importing_paddle(["clean", "heavy", "later"], tmp_path) == ["heavy"]
    assert importing_paddle(["clean"], tmp_path) == []


def sizes(root: Path) -> Dict[str, int]:
    return {str(path.relative_to(root.parent)): len(path.read_text().splitlines())
            for path in sorted(root.rglob("*.py"))}


def test_no_module_is_over_400_lines_and_every_face_is_thin():
    found = sizes(PACKAGE)
    assert {name: n for name, n in found.items() if n > MAX_LINES} == {}
    faces = {name: n for name, n in found.items()
             if name.endswith("/__init__.py") and name != "paddle_dist/__init__.py"}
    assert len(faces) >= 9 and {name: n for name, n in faces.items() if n > MAX_FACE_LINES} == {}


# ---------------------------------------------------------------- the layer order
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def layers(text: str) -> Dict[str, int]:
    """docs/architecture.md's numbered list after "Imports point down this list": each
    `name` quoted on line N (a package as `name/`, a module as `name`) -> N."""
    block = text[text.index("Imports point down this list"):].splitlines()[1:]
    found: Dict[str, int] = {}
    for line in block:
        numbered = line.split(". ", 1)
        if not numbered[0].isdigit():
            if found:
                break
            continue
        for name in numbered[1].split("`")[1::2]:
            found[name] = int(numbered[0])
    return found


def level_of(module: str, levels: Dict[str, int]):
    """(level, the entry that places it) of a dotted module name, or (None, None)."""
    rel = module[len("paddle_dist."):] if module.startswith("paddle_dist.") else ""
    if module == "paddle_dist":
        return levels.get("paddle_dist/__init__.py"), "paddle_dist/__init__.py"
    if rel.endswith("__main__"):
        return levels.get("__main__.py"), "__main__.py"
    for entry, level in levels.items():
        name = entry.replace("paddle_dist/", "").replace(".py", "").rstrip("/").replace("/", ".")
        if rel == name or (entry.endswith("/") and rel.startswith(f"{name}.")):
            return level, entry
    return None, None


def upward(graph: Dict[str, Set[str]], levels: Dict[str, int]) -> List[str]:
    """Every import of a module on a higher level (a smaller number) than its importer's."""
    found = []
    for name, targets in sorted(graph.items()):
        mine, _ = level_of(name, levels)
        for target in sorted(targets):
            theirs, _ = level_of(target, levels)
            if mine is not None and theirs is not None and theirs < mine:
                found.append(f"{name} (level {mine}) imports {target} (level {theirs})")
    return found


def test_every_module_has_a_level_and_no_import_goes_up_the_documented_order():
    levels, graph = layers(ARCHITECTURE.read_text()), import_graph(PACKAGE)
    assert len(set(levels.values())) == 10
    assert [m for m in graph if level_of(m, levels)[0] is None] == []
    assert upward(graph, levels) == []


def test_an_import_up_the_order_is_found():
    """The check can fail: a runs/ module importing checkpoint/ (one level up)."""
    levels = layers("Imports point down this list:\n1. `checkpoint/`\n2. `runs/`, `errors`\n\n## next\n")
    graph = {"paddle_dist.runs.listing": {"paddle_dist.checkpoint.io", "paddle_dist.errors"},
             "paddle_dist.checkpoint.io": {"paddle_dist.runs.layout"}, "paddle_dist.runs.layout": set()}
    assert upward(graph, levels) == ["paddle_dist.runs.listing (level 2) imports paddle_dist.checkpoint.io (level 1)"]


# ---------------------------------------------------------------- the commands' shape
# Scripts started by path, not commands: the watchdog, the network namespace's helper and
# the one-machine gate (each runs with `python -S FILE`, before paddle_dist is importable).
SCRIPTS_BY_PATH = {"paddle_dist.runtime._deadline", "paddle_dist.launch.isolate", "paddle_dist.security.rankgate"}


def command_problems(root: Path) -> List[str]:
    """architecture.md's rule for a command (`python -m paddle_dist.X`): its __main__ block is
    `run(<function>)` with options.run, and no module but options.py builds an argparse
    parser of its own (options.ArgParser makes a bad option one line and exit 2)."""
    found = []
    for name, path in module_files(root).items():
        tree = ast.parse(path.read_text(), str(path))
        if name != "paddle_dist.options" and any(
                isinstance(n, ast.Attribute) and n.attr == "ArgumentParser" for n in ast.walk(tree)):
            found.append(f"{name} builds an argparse.ArgumentParser; use options.ArgParser")
        guards = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        if not guards or name in SCRIPTS_BY_PATH:
            continue
        run_names = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                     and (n.module or "").endswith("options") for a in n.names if a.name == "run"}
        body = guards[0].body
        if not (len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call)
                and ast.unparse(body[0].value.func) in run_names and len(body[0].value.args) == 1):
            found.append(f"{name}: its __main__ block is not run(<main>) with options.run")
    return sorted(found)


def test_every_command_has_the_documented_shape():
    assert "ended by `options.run(main)`" in ARCHITECTURE.read_text()
    assert command_problems(PACKAGE) == []


def test_a_command_of_another_shape_is_found(tmp_path):
    """The check can fail: a command ending in sys.exit(main()) with argparse's own parser."""
    package = tmp_path / "paddle_dist"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "options.py").write_text("import argparse\nArgParser = argparse.ArgumentParser\ndef run(f): f()\n")
    (package / "good.py").write_text("from .options import ArgParser, run\ndef main(argv=None): return 0\n"
                                     "if __name__ == '__main__':\n    run(main)\n")
    (package / "bad.py").write_text("import argparse, sys\ndef main(argv=None):\n    argparse.ArgumentParser()\n"
                                    "if __name__ == '__main__':\n    sys.exit(main())\n")
    assert command_problems(package) == [
        "paddle_dist.bad builds an argparse.ArgumentParser; use options.ArgParser",
        "paddle_dist.bad: its __main__ block is not run(<main>) with options.run"]
