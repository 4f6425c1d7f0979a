"""Only the user's own runs: another user (uid 65534, played by a process that drops to it)
who plants an unfinished run under a shared output.root, or makes the output.run_dir or
output.root first, changes nothing a job does: nothing of theirs is continued, followed
through a link, locked or written."""

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from paddle_dist import config as configlib
from paddle_dist.errors import UserError
from paddle_dist.runs import rundir
from paddle_dist.runs.layout import Run

from .procs import run

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")


def _as_nobody(act) -> None:
    """Run `act()` in a forked child that became uid/gid 65534 (umask 0: what it makes, anyone
    may write); the child does file operations only, within 30 s (SIGALRM)."""
    pid = os.fork()
    if pid == 0:                                  # the child: never returns into pytest
        code = 1
        try:
            signal.alarm(30)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.umask(0)
            act()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.fixture
def shared():
    """A directory every user may add to, as /tmp is (sticky), outside pytest's own (0700)
    temporary directories; and a file only root may read or write."""
    folder = Path(tempfile.mkdtemp(prefix="pd-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    secret = folder / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    try:
        yield folder, secret
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _cfg(**keys):
    return configlib.load(None, ["output.name=job", *(f"{k.replace('__', '.')}={v}" for k, v in keys.items())])


def _plant(root: Path, cfg, secret: Path) -> Path:
    """As the other user: an unfinished run of the same experiment, its lock a link to `secret`."""
    identity = {"name": "job", "config_hash": configlib.config_hash(cfg.to_dict()), "world_size": 2,
                "job": "train", "created": 9e9, "attempts": 1, "same_command_continues": True}
    planted = root / "job-29991231-235959"

    def plant():
        planted.mkdir(parents=True, exist_ok=True)
        Run(planted).run_file.write_text(json.dumps(identity))
        (planted / ".lock").symlink_to(secret)
    _as_nobody(plant)
    return planted


def test_a_run_planted_in_a_shared_root_is_never_continued_followed_or_written(shared):
    folder, secret = shared
    cfg = _cfg(output__root=folder)
    planted = _plant(folder, cfg, secret)
    choice = rundir.choose(cfg, 2, ["python", "train.py"])
    rundir.release(choice.path)
    assert choice.path != planted.resolve() and choice.path.parent == folder.resolve()
    assert secret.read_text() == "root's\n" and sorted(p.name for p in planted.iterdir()) == [".lock", "run.json"]
    assert os.lstat(choice.path).st_uid == 0


def test_a_root_or_run_directory_another_user_made_first_is_refused_in_one_line(shared):
    folder, secret = shared
    _as_nobody(lambda: [(folder / name).mkdir() for name in ("runs", "theirs")])
    with pytest.raises(UserError, match=r"output.root .*/runs is not yours alone \(it belongs to user nobody"):
        rundir.choose(_cfg(output__root=folder / "runs"), 2)
    with pytest.raises(UserError, match=r"output.run_dir .*/theirs is not yours alone \(it belongs to"):
        rundir.choose(_cfg(output__run_dir=folder / "theirs"), 2)
    assert list((folder / "runs").iterdir()) == [] and list((folder / "theirs").iterdir()) == []


def test_a_job_given_another_users_root_exits_2_with_one_line_and_writes_nothing(shared):
    folder, secret = shared
    root = folder / "runs"
    _as_nobody(root.mkdir)
    planted = _plant(root, _cfg(), secret)
    done = run(["train.py", "-c", "configs/synthetic_lenet.yaml", "-o", f"output.root={root}",
                "-o", "train.max_steps=1"], timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "is not yours alone (it belongs to user nobody (uid 65534))" in done.stderr
    assert sorted(p.name for p in root.iterdir()) == [planted.name]
    assert secret.read_text() == "root's\n"


def test_no_file_of_a_run_is_written_through_a_link(shared, tmp_path):
    """Links in a run directory of one's own (made before the job, say by an earlier
    version or by hand) are never followed: the job ends with exit 2 and one line naming
    the link, and the files they point to are untouched."""
    folder, secret = shared
    run_dir = tmp_path / "run"
    Run(run_dir).logs.mkdir(parents=True)
    Run(run_dir).rank_log(0).symlink_to(secret)
    done = run(["train.py", "-c", "configs/synthetic_lenet.yaml", "-o", f"output.run_dir={run_dir}",
                "-o", "train.max_steps=1"], timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{run_dir}/logs/rank0.log is a symbolic link, and paddle_dist writes no file of a run " \
           "through one; remove the link" in done.stderr
    assert secret.read_text() == "root's\n"
    run_dir = tmp_path / "run2"
    run_dir.mkdir()
    Run(run_dir).samples.symlink_to(secret)
    done = run(["train.py", "-c", "configs/synthetic_lenet.yaml", "-o", f"output.run_dir={run_dir}",
                "-o", "train.max_steps=1", "-o", "train.log_samples=true"], timeout=120)
    assert done.returncode == 2 and "samples.tsv is a symbolic link" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and secret.read_text() == "root's\n"
