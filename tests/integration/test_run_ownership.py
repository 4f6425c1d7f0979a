"""Only the user's own runs: another user (uid 65534, played by a process that drops to it)
who plants an unfinished run under a shared output.root, or makes the output.run_dir or
output.root first, or a directory above them, or a machine's run directory or the
launcher's log directory, changes nothing a job does: nothing of theirs is continued,
followed through a link, locked or written (issue 53, findings 1, 2, 3 and 6)."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from paddle_dist import config as configlib
from paddle_dist.errors import UserError
from paddle_dist.runs import rundir
from paddle_dist.runs.layout import Run

from ..oracles import NOBODY, as_nobody
from .procs import run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")


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
    as_nobody(plant)
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
    as_nobody(lambda: [(folder / name).mkdir() for name in ("runs", "theirs")])
    with pytest.raises(UserError, match=r"output.root .*/runs is not yours alone \(it belongs to user nobody"):
        rundir.choose(_cfg(output__root=folder / "runs"), 2)
    with pytest.raises(UserError, match=r"output.run_dir .*/theirs is not yours alone \(it belongs to"):
        rundir.choose(_cfg(output__run_dir=folder / "theirs"), 2)
    assert list((folder / "runs").iterdir()) == [] and list((folder / "theirs").iterdir()) == []


def test_a_job_given_another_users_root_exits_2_with_one_line_and_writes_nothing(shared):
    folder, secret = shared
    root = folder / "runs"
    as_nobody(root.mkdir)
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


def _one_line(done, text: str) -> None:
    """`done` ended with exit 2 and one line that says `text`, and no traceback."""
    said = [line for line in done.stderr.splitlines() if text in line]
    assert done.returncode == 2 and len(said) == 1 and said[0].endswith(text), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


TRAIN = ["train.py", "-c", "configs/synthetic_lenet.yaml", "-o", "train.max_steps=1"]


@pytest.mark.parametrize("key", ["output.run_dir", "output.root"])
def test_a_run_inside_a_directory_of_another_user_is_refused_in_one_line(shared, key):
    """Finding 1, the parent swap: they make SHARED/exp (0755, theirs) first; a run made inside
    it could be renamed away by them and replaced by a run of theirs (zeroed weights to
    resume, logs to read). The job exits 2 before it writes anything."""
    folder, secret = shared
    exp = folder / "exp"

    def plant():
        exp.mkdir(mode=0o755)
        (exp / "decoy").symlink_to(secret)
    as_nobody(plant)
    done = run(TRAIN + ["-o", f"{key}={exp / 'run1'}"], timeout=120)
    _one_line(done, f"{key} {exp}/run1 is inside {exp}, which is not yours alone (it belongs to user nobody "
                    f"(uid 65534)): whoever can change it can put a directory of theirs in place of yours; "
                    f"choose a directory of your own (-o {key}=...)")
    assert [p.name for p in exp.iterdir()] == ["decoy"] and secret.read_text() == "root's\n"


def test_a_ranks_run_directory_made_first_by_another_user_is_refused(shared):
    """Finding 2: a rank whose launcher chose the run (mpirun's or srun's ranks on another
    machine, a node > 0) checks it on its machine as node 0 does: here it was made first by
    the other user, with a link where the rank's log goes."""
    folder, secret = shared
    theirs = folder / "run"

    def plant():
        theirs.mkdir(mode=0o777)
        (theirs / "logs").mkdir(mode=0o777)
        (theirs / "logs" / "rank0.log").symlink_to(secret)
    as_nobody(plant)
    done = run(TRAIN + ["-o", f"output.run_dir={theirs}"], env={"PADDLE_DIST_SUPERVISED": "1"}, timeout=120)
    _one_line(done, f"output.run_dir {theirs} is not yours alone (it belongs to user nobody (uid 65534)): someone "
                    "else could read, plant or change what the job keeps there; choose a directory of your own "
                    "(-o output.run_dir=...)")
    assert sorted(p.name for p in theirs.rglob("*")) == ["logs", "rank0.log"] and secret.read_text() == "root's\n"


def test_a_planted_log_directory_is_refused_before_anything_is_written_or_removed(shared, tmp_path):
    """Finding 3: they make the launcher's --log_dir first (log/ in a working directory all
    may write to), with links at every name the launcher and rank 0 write there."""
    folder, secret = shared
    log = folder / "log"
    names = ["launcher.err", "workerlog.0", "run_dir"] + [f".run_dir.tmp-{pid}" for pid in range(300, 400)]

    def plant():
        log.mkdir(mode=0o777)
        for name in names:
            (log / name).symlink_to(secret)
    as_nobody(plant)
    script = tmp_path / "script.py"
    script.write_text("print('trained')\n")
    done = run(["-m", "paddle_dist.launch", "--log_dir", str(log), str(script)], timeout=120)
    _one_line(done, f"--log_dir {log} is not yours alone (it belongs to user nobody (uid 65534)): someone else "
                    "could read, plant or change what the job keeps there; choose a directory of your own "
                    "(--log_dir DIR)")
    assert "trained" not in done.stdout and sorted(p.name for p in log.iterdir()) == sorted(names)
    assert secret.read_text() == "root's\n"


@pytest.mark.parametrize("folder_name", ["checkpoints", "logs", "status"])
def test_a_linked_folder_inside_a_run_is_refused_and_what_it_points_to_untouched(shared, tmp_path, folder_name):
    """Finding 6: a folder of a run that is a link (here to a directory of the other user's,
    holding a checkpoint of theirs) is neither read nor written through."""
    folder, secret = shared
    theirs = folder / "theirs"

    def plant():
        (theirs / "ckpt_000000016").mkdir(parents=True)
        (theirs / "latest").write_text("ckpt_000000016\n")
    as_nobody(plant)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / folder_name).symlink_to(theirs)
    done = run(TRAIN + ["-o", f"output.run_dir={run_dir}"], timeout=120)
    _one_line(done, f"{run_dir}/{folder_name} is a symbolic link, and paddle_dist writes no file of a run "
                    "through one; remove the link")
    assert sorted(p.name for p in theirs.rglob("*")) == ["ckpt_000000016", "latest"]
    assert sorted(p.name for p in run_dir.iterdir()) == [folder_name] and secret.read_text() == "root's\n"
