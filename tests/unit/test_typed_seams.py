"""The seams say their types: every parameter of the package named for the config (`cfg`, a
section's `sync_cfg`) or for who a process is (`env`) carries an annotation (Config,
DistEnv, SyncConfig, or a Mapping of variables where `env` is one), read from the source
with `ast`.
"""

import ast
from pathlib import Path
from typing import List

PACKAGE = Path(__file__).resolve().parents[2] / "paddle_dist"
SEAMS = ("cfg", "env", "sync_cfg")


def unannotated(root: Path, names=SEAMS) -> List[str]:
    """'path:line function(name)' for each parameter among `names` without an annotation."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [f"{path.relative_to(root.parent)}:{node.lineno} {node.name}({arg.arg})"
                      for arg in args if arg.arg in names and arg.annotation is None]
    return found


def test_every_cfg_and_env_parameter_is_annotated():
    assert unannotated(PACKAGE) == []


def test_an_unannotated_parameter_is_found(tmp_path):
    """The check can fail: one parameter of three left bare."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("def f(cfg: 'Config', env):\n    pass\n\n"
                                  "class C:\n    def g(self, *, sync_cfg: 'SyncConfig'):\n        pass\n")
    assert unannotated(package) == ["pkg/a.py:1 f(env)"]
