"""`python -m paddle_dist.train`: a job started as a module is continued, relaunched and
described as that module (`python -m paddle_dist.train ...`), never as the module's file
run as a script, whose directory would come first on sys.path and shadow other modules.

The ranks' argv is launcher.plan's (tests/unit/launch/test_launcher.py); here: which command this
process is (commands.main_module, own_command, invoking_command, train.this_command) and what
launch/job.py tells the other machines (job.tell_other_nodes).
"""

import subprocess
import sys

from paddle_dist import train
from paddle_dist.launch import job
from paddle_dist.runs import commands
from paddle_dist.config import load

from tests.conftest import REPO_ROOT

PY = sys.executable
TRAIN_FILE = "/site-packages/paddle_dist/train.py"     # sys.argv[0] under -m


def _run(args, cwd):
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([PY, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_main_module_and_own_command_of_a_process_started_with_dash_m(tmp_path):
    (tmp_path / "probe_mod.py").write_text(
        "from paddle_dist.runs import commands\nprint(commands.main_module())\nprint(commands.own_command()[1:])\n")
    out = _run(["-m", "probe_mod", "-o", "a=1"], tmp_path)
    assert out.stdout.splitlines() == ["probe_mod", "['-m', 'probe_mod', '-o', 'a=1']"], out.stderr


def test_a_package_run_with_dash_m_is_named_as_the_package(tmp_path):
    (tmp_path / "probe_pkg").mkdir()
    (tmp_path / "probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "probe_pkg" / "__main__.py").write_text(
        "from paddle_dist.runs import commands\nprint(commands.main_module())\nprint(commands.own_command()[1:])\n")
    out = _run(["-m", "probe_pkg", "-o", "a=1"], tmp_path)
    assert out.stdout.splitlines() == ["probe_pkg", "['-m', 'probe_pkg', '-o', 'a=1']"], out.stderr


def test_a_script_has_no_main_module(tmp_path):
    (tmp_path / "probe.py").write_text(
        "from paddle_dist.runs import commands\nprint(repr(commands.main_module()))\nprint(commands.own_command()[1:])\n")
    out = _run(["probe.py", "-o", "a=1"], tmp_path)
    assert out.stdout.splitlines() == ["''", "['probe.py', '-o', 'a=1']"], out.stderr


def test_own_command_of_a_module_names_the_module_not_its_file():
    command = commands.own_command([TRAIN_FILE, "-o", "dist.nprocs=2"], "paddle_dist.train")
    assert command[1:] == ["-m", "paddle_dist.train", "-o", "dist.nprocs=2"]
    assert commands.own_command(["train.py", "-o", "x=1"])[1:] == ["train.py", "-o", "x=1"]


def test_invoking_command_of_a_module_rank_is_the_outermost_command_running_the_module():
    """A rank of `mpirun -n 2 python -m paddle_dist.train` (a parent whose words name the
    module): that parent's command is the one to run again."""
    child = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); from paddle_dist.runs import commands; " \
            f"print(commands.invoking_command([{TRAIN_FILE!r}, '-o', 'a=1'], 'paddle_dist.train'))"
    outer = [PY, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], timeout=30)",
             "-n", "2", "python", "-m", "paddle_dist.train", "-o", "a=1"]
    out = subprocess.run(outer, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(outer), out.stderr
    # Started by hand: its own command, as the module.
    alone = commands.invoking_command([TRAIN_FILE, "-o", "b=2"], "paddle_dist.train")
    assert alone[1:] == ["-m", "paddle_dist.train", "-o", "b=2"]


def test_this_command_is_the_module_under_dash_m(monkeypatch):
    monkeypatch.setattr(commands, "main_module", lambda: "paddle_dist.train")
    assert train.this_command() == ("", "paddle_dist.train")
    monkeypatch.setattr(commands, "main_module", lambda: "")
    monkeypatch.setattr(sys, "argv", ["train.py", "-o", "x=1"])
    script, module = train.this_command()
    assert script.endswith("/train.py") and script.startswith("/") and module == ""


def test_the_other_machines_are_told_the_module_command(capsys):
    cfg = load(overrides=["dist.nnodes=3", "dist.master=10.0.0.1:6170", "dist.nprocs=2"])
    args = ["-o", "dist.nnodes=3", "-o", "dist.node_rank=0", "-o", "dist.master=10.0.0.1:6170"]
    job.tell_other_nodes(cfg, "", args, "paddle_dist.train")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        f"  python -m paddle_dist.train -o dist.nnodes=3 -o dist.master=10.0.0.1:6170 "
        f"-o dist.node_rank={node}" for node in (1, 2)]


def test_the_other_machines_are_told_the_script_command(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cfg = load(overrides=["dist.nnodes=2", "dist.master=10.0.0.1:6170"])
    job.tell_other_nodes(cfg, str(tmp_path / "train.py"), ["-o", "dist.node_rank=0"])
    assert capsys.readouterr().out.splitlines()[1:] == ["  python train.py -o dist.node_rank=1"]
