"""Fixtures shared by the unit tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_python(tmp_path):
    """run(code, *path): `code` in a fresh interpreter started in `tmp_path` whose PYTHONPATH
    is `path`; its (stdout, stderr). The test fails if it exits with an error."""
    def run(code, *path):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr
    return run


@pytest.fixture
def without_paddle(tmp_path):
    """Run `python ARGS` from `tmp_path` in a fresh interpreter whose `import paddle` fails
    as on a machine without it (a stand-in package first on the path raises
    ModuleNotFoundError); returns the CompletedProcess (text)."""
    absent = tmp_path / "no_paddle" / "paddle"
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'paddle'\", name='paddle')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(absent.parent), str(ROOT)])}

    def run(*args):
        return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
    return run
