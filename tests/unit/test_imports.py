"""The package's imports form a directed acyclic graph (docs/architecture.md): read from the
source with `ast`, every import counted, at module level or inside a function.

A submodule's implicit import of its own package does not count (Python loads the parent
first, whatever the code says); a package's __init__ importing its submodules does.
"""

import ast
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
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
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


def test_command_lines_are_imported_by_no_library_module():
    """cli, and the `python -m` entry points' command lines, sit at the top."""
    graph = import_graph(PACKAGE)
    entries = {"paddle_dist.launch.job"} | {name for name in graph if name.endswith("__main__")}
    importers = {name: sorted(n for n, targets in graph.items() if name in targets and n not in entries)
                 for name in entries}
    # `python -m paddle_dist.launch` and `python -m paddle_dist.train` are cli's entries
    allowed = {"paddle_dist.launch", "paddle_dist.train"}
    assert {name: [n for n in found if n not in allowed] for name, found in importers.items()
            if [n for n in found if n not in allowed]} == {}
