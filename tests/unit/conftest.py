"""Fixtures shared by the unit tests."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_python(tmp_path):
    """run(code, *path): `code` in a fresh interpreter started in `tmp_path` whose PYTHONPATH
    is `path`; its (stdout, stderr). The test fails if it exits with an error, or if it is
    still running after 120 s: then with every thread's Python stack (SIGABRT, which
    faulthandler reports), and nothing it started is left."""
    def run(code, *path):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
        env["PYTHONFAULTHANDLER"] = "1"
        child = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            try:
                out, err = child.communicate(timeout=20)
            finally:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            pytest.fail(f"still running after 120 s; its stacks:\n{err[-6000:]}", pytrace=False)
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)      # its own children (DataLoader workers)
            except ProcessLookupError:
                pass
        assert child.returncode == 0, err
        return out, err
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
