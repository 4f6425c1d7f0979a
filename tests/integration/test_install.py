"""A non-editable install works on its own: a wheel of this checkout, installed in a fresh
virtual environment and run from a directory outside the checkout, trains the built-in
job (`python -m paddle_dist.train`, 2 ranks), finds its bundled configs and MNIST subset,
passes `doctor --check`, launches a user's script, and exports and serves the run.

How the installed copy is kept apart from the checkout (which the test's own interpreter
has as an editable install):

- the wheel is built from a copy of the checkout (no build/ or egg-info left in it):
  `pip wheel --no-build-isolation` when this interpreter can build wheels by itself
  (offline), else with pip's usual isolated build (setuptools and wheel from the index);
- the venv is made `--without-pip` and the wheel installed into its site-packages by this
  interpreter's pip (`pip install --no-deps --target`), before anything else is added;
- Paddle, numpy, PyYAML and VisualDL are reused from this interpreter, not installed
  again (fast, offline): a `host.pth` in the venv lists this interpreter's site-packages
  directories. A .pth file's plain lines only append directories to sys.path, after the
  venv's own site-packages (where the wheel is); the .pth files inside those directories,
  among them the editable install's finder, are not run, and the checkout is not on the
  path. (`--system-site-packages` would not do: it adds the base interpreter's packages,
  not this environment's, and runs the .pth files of what it adds.)
- every command runs with the venv's interpreter, from a temporary directory, without
  PYTHONPATH; a probe (`probe.pth`) has every process that imported paddle_dist write
  the file it imported it from, so the test sees which copy each rank really used.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional

import pytest
from PIL import Image

from paddle_dist.data.mnist import load_mnist
from paddle_dist.runs.layout import Run

from ..oracles import read_metrics
from .procs import ROOT, check, run

pytestmark = pytest.mark.compat

# Outputs at the checkout's top (runs/, log/, ...), never a package of the same name inside it
# (paddle_dist/runs/), and caches anywhere.
TOP_LEVEL_OUTPUTS = {".venv", ".carry", ".gpukit", ".git", "runs", "log", "build", "dist", ".pytest_cache",
                     "bench-results"}
CACHES = shutil.ignore_patterns("*.egg-info", "__pycache__", "*.pyc")


def not_build_inputs(directory: str, names):
    ignored = set(CACHES(directory, names))
    if Path(directory).resolve() == ROOT.resolve():
        ignored |= {n for n in names if n in TOP_LEVEL_OUTPUTS or n.startswith(".venv-")}
    return ignored
# One line of a .pth file, run by site.py at start-up (in a function's scope: the lambda
# takes what it uses as defaults).
PROBE = ("import atexit, os, sys; d = os.environ.get('PADDLE_DIST_TEST_PROBE'); "
         "d and atexit.register(lambda d=d, os=os, sys=sys: open(os.path.join(d, str(os.getpid())), 'w')"
         ".write(getattr(sys.modules.get('paddle_dist'), '__file__', None) or '-'))\n")
USER_SCRIPT = """\
import os, sys
import paddle_dist

cfg = paddle_dist.load_config()          # -c / -o of paddle_dist.launch reach it
rank = os.environ["PADDLE_TRAINER_ID"]
with open(os.path.join(sys.argv[1], rank), "w") as f:
    f.write(f"{os.environ['PADDLE_TRAINERS_NUM']} {cfg.train.epochs} {paddle_dist.__file__}")
"""


def _build_wheel(tmp: Path) -> Path:
    src, out = tmp / "src", tmp / "wheel"
    shutil.copytree(ROOT, src, ignore=not_build_inputs)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(out), str(src)]
    offline = run(pip[:4] + ["--no-build-isolation"] + pip[4:], timeout=300, cwd=tmp)
    if offline.returncode != 0:       # no bdist_wheel here (setuptools < 70.1 without wheel)
        isolated = run(pip, timeout=300, cwd=tmp)
        assert isolated.returncode == 0, (f"cannot build a wheel:\n{offline.stderr[-2000:]}\n"
                                          f"{isolated.stdout[-2000:]}\n{isolated.stderr[-2000:]}")
    [wheel] = out.glob("paddle_dist-*.whl")
    return wheel


def _host_site_dirs() -> List[str]:
    """This interpreter's site-packages directories, where Paddle and the rest are."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def _make_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    check(run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120, cwd=tmp))
    python = venv / "bin" / "python"
    site = Path(check(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          timeout=60, cwd=tmp)).stdout.strip())
    check(run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir",
               "--target", str(site), str(wheel)], timeout=300, cwd=tmp))
    (site / "host.pth").write_text("".join(f"{d}\n" for d in _host_site_dirs()))
    (site / "probe.pth").write_text(PROBE)
    return venv


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, environment, working directory outside the checkout) with the wheel installed."""
    tmp = tmp_path_factory.mktemp("install")
    assert ROOT not in tmp.resolve().parents, "the temporary directory must be outside the checkout"
    venv = _make_venv(tmp, _build_wheel(tmp))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV",
                        "PYTEST_CURRENT_TEST")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    work = tmp / "work"
    work.mkdir()
    return venv, env, work


def _run(installed, args: List[str], timeout: float = 120, probe: Optional[Path] = None):
    venv, env, work = installed
    if probe is not None:
        probe.mkdir()
        env = dict(env, PADDLE_DIST_TEST_PROBE=str(probe))
    return run([str(venv / "bin" / "python"), *args], timeout=timeout, cwd=work, base_env=env)


def _imported_from(probe: Path) -> List[str]:
    return sorted(p.read_text() for p in probe.iterdir() if p.read_text() != "-")


def test_the_installed_wheel_runs_everything_outside_the_checkout(installed, tmp_path):
    venv, _, work = installed
    package = str(next((venv / "lib").glob("python3*/site-packages")) / "paddle_dist")

    # The installed copy, with its bundled configs; a bad name lists them.
    bundled = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    checks = check(_run(installed, ["-c", (
        "import sys, paddle_dist\n"
        "from paddle_dist.schema import CONFIG_DIR\n"
        "print(paddle_dist.__file__); print(CONFIG_DIR)\n"
        "print(paddle_dist.load_config('mnist_lenet').model.name)\n"
        "try: paddle_dist.load_config('no_such_config')\n"
        "except Exception as exc: print(exc)\n"
        f"print({str(ROOT)!r} in sys.path, any('Editable' in repr(f) for f in sys.meta_path))\n")]))
    lines = checks.stdout.splitlines()
    assert lines[0] == f"{package}/__init__.py" and lines[1] == f"{package}/configs"
    assert lines[2] == "lenet"
    assert lines[3] == f"config file 'no_such_config' not found; pass a YAML path or one of: {', '.join(bundled)}"
    assert lines[4] == "False False"

    check(_run(installed, ["-m", "paddle_dist.doctor", "--check"], timeout=180))

    # The built-in job, 2 ranks started by the installed module, on the bundled MNIST.
    probe = tmp_path / "train-probe"
    trained = check(_run(installed, ["-m", "paddle_dist.train", "-o", "dist.nprocs=2", "-o", "train.epochs=1"],
                       timeout=300, probe=probe))
    assert "test accuracy" in trained.stdout
    [run_dir] = [d for d in (work / "runs").iterdir() if d.is_dir()]
    metrics = read_metrics(run_dir)
    assert metrics["test_samples"] == 1000 and metrics["test_accuracy"] > 0.8, metrics
    assert metrics["world_size"] == 2
    command = json.loads(Run(run_dir).run_file.read_text())["command"]
    assert command[1:] == ["-m", "paddle_dist.train", "-o", "dist.nprocs=2", "-o", "train.epochs=1"]
    # The launcher and both ranks imported the installed copy, and nothing else.
    assert _imported_from(probe) == [f"{package}/__init__.py"] * 3

    # A user's script under paddle_dist.launch.
    (work / "user_job.py").write_text(USER_SCRIPT)
    out = tmp_path / "user-out"
    out.mkdir()
    check(_run(installed, ["-m", "paddle_dist.launch", "--nprocs", "2", "-o", "train.epochs=7",
                         "user_job.py", str(out)], timeout=180))
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        r: f"2 7 {package}/__init__.py" for r in ("0", "1")}

    # Export the run, then predict 20 bundled test digits saved as PNG files.
    check(_run(installed, ["-m", "paddle_dist.export", str(run_dir)], timeout=180))
    assert (run_dir / "export" / "deploy.json").is_file()
    images, labels = load_mnist("", "test")
    paths = []
    for i in range(20):
        paths.append(str(tmp_path / f"digit{i}.png"))
        Image.fromarray(images[i]).save(paths[-1])
    predicted = json.loads(check(_run(installed, ["-m", "paddle_dist.predict", str(run_dir / "export"),
                                                *paths, "--json"], timeout=180)).stdout)
    right = sum(p["top"][0]["index"] == int(label) for p, label in zip(predicted, labels[:20]))
    assert right >= 14, predicted                   # a model with test accuracy > 0.8
