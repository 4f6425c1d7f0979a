"""Which run a command continues (paddle_dist/runs/rundir.py): the rule, the locks that keep
two jobs apart, and the command a report prints to continue a run.

Other processes here are real ones (they hold locks or show their command line); each is
bounded by a timeout and ends before its test does.
"""

import os
from pathlib import Path
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

from paddle_dist import config as configlib
from paddle_dist.runs import commands, rundir
from paddle_dist.errors import UserError
from paddle_dist.runs.layout import Run

PY = sys.executable
ROOT = str(Path(__file__).resolve().parents[3])


def cfg_for(tmp_path, *overrides):
    cfg = configlib.load(None, ["output.name=job", f"output.root={tmp_path / 'runs'}", *overrides])
    return cfg


def choose(cfg, world=2, command=("python", "train.py")):
    choice = rundir.choose(cfg, world, list(command))
    rundir.release(choice.path)       # as a job that ended would
    return choice


def finish(path):
    Run(path).metrics.write_text("{}")


def runs(tmp_path):
    return sorted(d.name for d in (tmp_path / "runs").iterdir() if d.is_dir())


def test_a_first_run_is_new_and_records_what_it_is(tmp_path):
    choice = choose(cfg_for(tmp_path), command=["python", "train.py", "-o", "dist.nprocs=2"])
    info = rundir.read_run(choice.path)
    assert choice.path.name.startswith("job-") and choice.note == ""
    assert info["world_size"] == 2 and info["attempts"] == 1 and info["same_command_continues"]
    assert info["config_hash"] == configlib.config_hash(cfg_for(tmp_path).to_dict())
    assert info["command"] == ["python", "train.py", "-o", "dist.nprocs=2"]


def test_an_unfinished_run_is_continued_from_where_it_stopped(tmp_path):
    first = choose(cfg_for(tmp_path)).path
    Run(first).status.mkdir()
    Run(first).rank_status(1).write_text('{"rank": 1, "state": "failed"}')
    (Run(first).checkpoints / "ckpt_000000010").mkdir(parents=True)
    again = choose(cfg_for(tmp_path, "train.epochs=9", "dist.nprocs=2", "checkpoint.every_steps=5"))
    assert again.path == first and runs(tmp_path) == [first.name]
    assert "continuing the unfinished run" in again.note and "attempt 2" in again.note
    assert "from its latest checkpoint" in again.note
    assert not list(Run(first).status.glob("rank*.json"))    # the last attempt's records go
    assert rundir.read_run(first)["attempts"] == 2


def test_a_finished_run_is_never_continued(tmp_path):
    first = choose(cfg_for(tmp_path)).path
    finish(first)
    again = choose(cfg_for(tmp_path))
    assert again.path != first and len(runs(tmp_path)) == 2
    assert again.note == f"the last run of this config, {first}, had finished; starting a new run in {again.path}"


def test_a_diverged_run_is_never_continued_nor_offered(tmp_path):
    """A run whose ranks' weights differed (exit 7: errors.Diverged) has no metrics.json, yet
    the same command starts a new run, names it, and no command continues it."""
    first = choose(cfg_for(tmp_path)).path
    Run(first).status.mkdir()
    Run(first).rank_status(0).write_text('{"rank": 0, "state": "diverged", "error": "the ranks\' '
                                                 'weights differ at step 4: ..."}')
    (Run(first).checkpoints / "ckpt_000000002").mkdir(parents=True)
    assert rundir.diverged(first).startswith("the ranks' weights differ at step 4")
    assert commands.resume_command(first) == ""
    again = choose(cfg_for(tmp_path))
    assert again.path != first and len(runs(tmp_path)) == 2
    assert again.note == (f"not continuing the last run of this config, {first}: its ranks' weights "
                          f"diverged (docs/faults.md); starting a new run in {again.path}")
    with pytest.raises(UserError, match="holds a run whose ranks' weights diverged.*checkpoint.resume="):
        rundir.choose(cfg_for(tmp_path, f"output.run_dir={first}"), 2)
    assert rundir.diverged(again.path) == ""


@pytest.mark.parametrize("change", [["train.lr=0.01"], ["model.name=mlp"], ["output.name=other"]])
def test_another_experiment_starts_a_new_run(tmp_path, change):
    first = choose(cfg_for(tmp_path)).path
    assert choose(cfg_for(tmp_path, *change)).path != first


def test_another_world_size_continues_the_run_and_records_it(tmp_path):
    first = choose(cfg_for(tmp_path), world=2).path
    assert choose(cfg_for(tmp_path), world=4).path == first
    assert rundir.read_run(first)["world_size"] == 4
    assert choose(cfg_for(tmp_path), world=2).path == first


def test_resume_none_or_a_path_always_starts_a_new_run(tmp_path):
    first = choose(cfg_for(tmp_path)).path
    assert choose(cfg_for(tmp_path, "checkpoint.resume=none")).path != first
    other = choose(cfg_for(tmp_path, f"checkpoint.resume={first}"))
    assert other.path != first and not rundir.read_run(other.path)["same_command_continues"]


def test_the_newest_run_of_the_experiment_decides(tmp_path):
    old = choose(cfg_for(tmp_path)).path                      # unfinished, but older
    newer = choose(cfg_for(tmp_path, "checkpoint.resume=none")).path
    finish(newer)
    latest = choose(cfg_for(tmp_path))
    assert latest.path not in (old, newer) and str(newer) in latest.note


HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from paddle_dist import config
    from paddle_dist.runs import rundir
    cfg = config.load(None, ["output.name=job", "output.root={runs}"])
    print(rundir.choose(cfg, 2, ["python", "train.py"]).path, flush=True)
    sys.stdin.read()          # holds the run until the test closes its stdin
""")


def test_a_run_held_by_a_live_job_is_never_shared(tmp_path):
    script = HOLDER.format(root=ROOT, runs=tmp_path / "runs")
    holder = subprocess.Popen([PY, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = holder.stdout.readline().strip()
        mine = rundir.choose(cfg_for(tmp_path), 2, ["python", "train.py"])
        assert str(mine.path) != held
        rundir.release(mine.path)
        shutil.rmtree(mine.path)      # leaves the held run the newest of the experiment
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # Its holder gone (exited, or killed: the kernel drops the lock), the run is free.
    assert str(choose(cfg_for(tmp_path)).path) == held


def test_jobs_started_at_the_same_time_get_their_own_runs(tmp_path):
    """Eight choosers, released together by a pipe: eight different directories."""
    script = HOLDER.format(root=ROOT, runs=tmp_path / "runs").replace(
        "print(rundir", "sys.stdin.readline()\nprint(rundir")
    procs = [subprocess.Popen([PY, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(8)]
    try:
        for proc in procs:
            proc.stdin.write("go\n")
        for proc in procs:
            proc.stdin.flush()
        chosen = [proc.stdout.readline().strip() for proc in procs]
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=30)
    assert len(set(chosen)) == 8 and all(chosen), chosen


def test_a_named_run_dir_in_use_or_finished_is_refused(tmp_path):
    script = HOLDER.format(root=ROOT, runs=tmp_path / "runs")
    holder = subprocess.Popen([PY, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = holder.stdout.readline().strip()
        with pytest.raises(UserError, match=f"output.run_dir {held} is in use by another job .pid {holder.pid}"):
            rundir.choose(cfg_for(tmp_path, f"output.run_dir={held}"), 2)
        # A rank started by paddle_dist's launcher does not hold: its launcher does.
        assert str(rundir.chosen_by_launcher(cfg_for(tmp_path, f"output.run_dir={held}"))) == held
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    finish(tmp_path / "runs" / os.path.basename(held))
    with pytest.raises(UserError, match="already holds a finished run"):
        rundir.choose(cfg_for(tmp_path, f"output.run_dir={held}"), 2)


def test_the_other_machines_of_a_job_write_under_node_0s_run_name(tmp_path):
    cfg = cfg_for(tmp_path, "dist.nnodes=2", "dist.node_rank=1", "dist.master=198.18.0.1:6170")
    path = rundir.node_run_dir(cfg, "job-20261125-090351")
    assert path == (tmp_path / "runs" / "job-20261125-090351").resolve() and path.is_dir()
    assert not rundir.read_run(path)                 # node 0 holds and records the run
    assert rundir.node_run_dir(cfg, "job-20261125-090351") == path      # the same command again
    assert rundir.node_run_dir(cfg, "job-20261125-100000") != path      # another job: another one
    named = cfg_for(tmp_path, "dist.nnodes=2", "dist.node_rank=1", "dist.master=198.18.0.1:6170",
                    f"output.run_dir={tmp_path / 'mine'}")
    assert rundir.node_run_dir(named, "job-20261125-090351") == (tmp_path / "mine").resolve()
    with pytest.raises(UserError, match="node 0 did not name its run directory"):
        rundir.node_run_dir(cfg, "")


def test_a_machine_clears_only_its_own_ranks_status(tmp_path):
    Run(tmp_path).status.mkdir()
    for rank in range(4):
        Run(tmp_path).rank_status(rank).write_text("{}")
    rundir.clear_status(tmp_path, range(2, 4))
    assert sorted(p.name for p in Run(tmp_path).status.iterdir()) == ["rank0.json", "rank1.json"]
    rundir.clear_status(tmp_path)
    assert not list(Run(tmp_path).status.iterdir())


# ------------------------------------------------------------------ the command to continue
def test_resume_command_is_the_same_command_when_it_finds_the_run(tmp_path):
    command = ["python", "train.py", "-o", "dist.nprocs=2", "-o", "train.lr=0.1 "]
    path = choose(cfg_for(tmp_path), command=command).path
    assert shlex.split(commands.resume_command(path)) == command


def test_resume_command_names_a_run_the_command_would_not_find(tmp_path):
    command = ["python", "train.py", "-o", "checkpoint.resume=none", "--override=output.run_dir=x"]
    path = choose(cfg_for(tmp_path, "checkpoint.resume=none"), command=command).path
    assert shlex.split(commands.resume_command(path)) == ["python", "train.py", "-o", f"output.run_dir={path}"]
    (Run(path).checkpoints / "ckpt_000000010").mkdir(parents=True)
    assert shlex.split(commands.resume_command(path))[-2:] == ["-o", "checkpoint.resume=auto"]
    assert commands.resume_command(tmp_path) == ""        # no run.json: nothing to say


def test_drop_overrides_knows_every_spelling():
    argv = ["a.py", "-o", "x.y=1", "-ox.y=2", "--override", "x.y=3", "--override=x.y=4",
            "-o", "x.z=5", "-c", "cfg"]
    assert commands.drop_overrides(argv, ["x.y"]) == ["a.py", "-o", "x.z=5", "-c", "cfg"]


def test_invoking_command_is_the_outermost_launcher_that_runs_the_script(tmp_path):
    """A rank under launchers that name the script (paddle_dist.launch starting
    paddle.distributed.launch starting the rank): the outermost command is the one to run
    again."""
    child = f"import sys; sys.path.insert(0, {ROOT!r}); from paddle_dist.runs import commands; " \
            "print(commands.invoking_command(['probe.py', '-o', 'a=1']))"
    inner = [PY, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], timeout=30)",
             "--nproc_per_node", "2", "probe.py", "-o", "a=1"]
    outer = [PY, "-c", f"import subprocess; subprocess.run({inner!r}, timeout=30)", "--nprocs", "2", "probe.py"]
    out = subprocess.run(outer, capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == str(outer)
    # Run by hand: its own command.
    assert commands.invoking_command(["nowhere.py", "-o", "b=2"])[1:] == ["nowhere.py", "-o", "b=2"]
    # A wrapper around the launcher (timeout here) is never the command to run again.
    wrapped = ["timeout", "60", *outer]
    out = subprocess.run(wrapped, capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == str(outer)


@pytest.mark.parametrize("words, launcher", [
    (["python3", "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "t.py"], True),
    (["/usr/bin/python3.11", "-u", "t.py", "-o", "dist.nprocs=2"], True),
    (["mpirun", "-n", "2", "python", "t.py"], True),
    (["srun", "python", "t.py"], True),
    (["timeout", "600", "python", "t.py"], False),
    (["bash", "-c", "python -m paddle_dist.launch t.py"], False),
    (["python", "wrapper.py", "t.py"], False),
    (["nohup", "python", "t.py"], False)])
def test_a_launcher_is_told_from_a_wrapper(words, launcher):
    assert commands.launches(words, "t.py") is launcher


FIT = {"model": "SmallCNN", "parameters": 2970, "parameters_digest": "d725e7ad494b2d75",
       "optimizer": "SGD", "lr": 0.05, "lr_scheduler": "", "optimizer_from": "script",
       "train_samples": 256, "eval_samples": 100}


def choose_fit(cfg, record, world=2):
    choice = rundir.choose(cfg, world, ["python", "mine.py"], extra={"fit": record})
    rundir.release(choice.path)
    return choice


def test_a_fit_run_is_continued_only_by_the_same_model_optimizer_and_data(tmp_path):
    first = choose_fit(cfg_for(tmp_path), FIT).path
    assert rundir.read_run(first)["fit"] == FIT
    assert choose_fit(cfg_for(tmp_path), dict(FIT)).path == first
    changed = choose_fit(cfg_for(tmp_path), dict(FIT, parameters_digest="0123456789abcdef"))
    assert changed.path != first
    assert changed.note == (f"not continuing the unfinished run {first}: its model's parameter names "
                            f"or shapes differ; starting a new run in {changed.path}")


@pytest.mark.parametrize("change, words", [
    ({"optimizer": "Adam"}, "its optimizer was SGD, this one is Adam"),
    ({"lr": 0.1}, "its lr was 0.05, this one is 0.1"),
    ({"train_samples": 300}, "it trained on 256 samples, this job on 300"),
    ({"model": "Other"}, "its model was SmallCNN, this one is Other")])
def test_why_a_fit_run_is_not_continued_is_said_in_words(tmp_path, change, words):
    first = choose_fit(cfg_for(tmp_path), FIT).path
    note = choose_fit(cfg_for(tmp_path), dict(FIT, **change)).note
    assert note.startswith(f"not continuing the unfinished run {first}: {words}")


def test_a_changed_config_says_why_its_run_is_not_continued_and_another_world_size_continues(tmp_path):
    first = choose(cfg_for(tmp_path)).path
    again = choose(cfg_for(tmp_path), world=4)         # the trainer re-plans its steps on 4 ranks
    assert again.path == first and again.note.startswith("continuing the unfinished run")
    assert "its config differs" in choose(cfg_for(tmp_path, "train.lr=0.01")).note
    for name in runs(tmp_path):       # finished runs are no candidates: nothing to explain
        finish(tmp_path / "runs" / name)
    assert not choose(cfg_for(tmp_path, "train.lr=0.5"), world=8).note.startswith("not continuing")


def test_a_built_in_job_never_continues_a_fit_run(tmp_path):
    first = choose_fit(cfg_for(tmp_path), FIT).path
    other = choose(cfg_for(tmp_path))
    assert other.path != first and "one is a paddle_dist.fit() run of a script's own model, the " \
        "other a built-in job" in other.note


def test_point_to_writes_the_run_for_the_launcher(tmp_path):
    rundir.point_to(tmp_path / "run", str(tmp_path / "pointer"))
    assert (tmp_path / "pointer").read_text() == f"{(tmp_path / 'run').resolve()}\n"
    rundir.point_to(tmp_path / "run", "")                     # nobody asked: nothing written
    rundir.point_to(tmp_path / "run", str(tmp_path / "no" / "such" / "dir" / "pointer"))  # no error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pointer"]


def test_a_named_run_dir_of_another_model_is_refused_and_left_as_it_was(tmp_path):
    named = tmp_path / "mine"
    cfg = cfg_for(tmp_path, f"output.run_dir={named}")
    rundir.release(rundir.choose(cfg, 2, ["python", "mine.py"], extra={"fit": FIT}).path)
    other = dict(FIT, parameters_digest="0123456789abcdef")
    with pytest.raises(UserError, match="holds an unfinished run of another model"):
        rundir.choose(cfg, 2, ["python", "mine.py"], extra={"fit": other})
    assert rundir.read_run(named)["fit"] == FIT and rundir.read_run(named)["attempts"] == 1
    fresh = cfg_for(tmp_path, f"output.run_dir={named}", "checkpoint.resume=none")
    rundir.release(rundir.choose(fresh, 2, ["python", "mine.py"], extra={"fit": other}).path)
    assert rundir.read_run(named)["fit"] == other


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")


def theirs(path):
    path.mkdir(parents=True)
    os.chown(path, 65534, 65534)           # the other user's, uid 65534
    return path


@as_root
def test_a_run_dir_or_root_inside_another_users_directory_is_refused(tmp_path):
    """The parent swap (issue 53, finding 1): every directory above the named one is checked."""
    exp = theirs(tmp_path / "exp")
    for key in ("output.run_dir", "output.root"):
        with pytest.raises(UserError, match=rf"^{key} {exp}/run1 is inside {exp}, which is not yours alone "
                                            r"\(it belongs to user nobody \(uid 65534\)\)"):
            rundir.choose(cfg_for(tmp_path, f"{key}={exp / 'run1'}"), 2)
    assert list(exp.iterdir()) == []


@as_root
def test_every_machine_and_rank_checks_its_run_directory(tmp_path):
    """Node > 0, and ranks whose launcher or rank 0 chose the run (mpirun, srun) (finding 2)."""
    made = theirs(tmp_path / "runs" / "job-1")
    with pytest.raises(UserError, match=r"^output.root .*/runs/job-1 is not yours alone \(it belongs to user nobody"):
        rundir.node_run_dir(cfg_for(tmp_path), "job-1")
    inside = f"output.run_dir .*/job-1/run is inside {made}, which is not yours alone"
    with pytest.raises(UserError, match=inside):
        rundir.node_run_dir(cfg_for(tmp_path, f"output.run_dir={made / 'run'}"), "job-1")
    with pytest.raises(UserError, match=inside):
        rundir.chosen_by_launcher(cfg_for(tmp_path, f"output.run_dir={made / 'run'}"))
    with pytest.raises(UserError, match=inside):
        rundir.joined(made / "run")
    assert list(made.iterdir()) == []
    assert rundir.node_run_dir(cfg_for(tmp_path), "job-2").stat().st_uid == os.geteuid()


def test_a_linked_folder_inside_a_run_is_refused_before_anything_is_written(tmp_path):
    """Linked checkpoints/ or logs/ in a run of one's own (finding 6), however it is taken."""
    (elsewhere := tmp_path / "elsewhere").mkdir()
    first = choose(cfg_for(tmp_path)).path
    Run(first).checkpoints.symlink_to(elsewhere)
    link = rf"^{first}/checkpoints is a symbolic link, and paddle_dist writes no file of a run through one"
    with pytest.raises(UserError, match=link):
        choose(cfg_for(tmp_path))
    assert rundir.read_run(first)["attempts"] == 1
    for call in (lambda: rundir.choose(cfg_for(tmp_path, f"output.run_dir={first}"), 2),
                 lambda: rundir.joined(first), lambda: rundir.node_run_dir(cfg_for(tmp_path), first.name)):
        with pytest.raises(UserError, match=link):
            call()
    Run(first).checkpoints.rename(Run(first).logs)
    with pytest.raises(UserError, match=rf"^{first}/logs is a symbolic link"):
        choose(cfg_for(tmp_path))
    assert list(elsewhere.iterdir()) == [] and rundir.read_run(first)["attempts"] == 1


def test_the_run_pointer_is_never_written_through_a_link_nor_into_another_users_directory(tmp_path):
    """Finding 3: a link at the pointer's temporary name, or a log directory of theirs."""
    (canary := tmp_path / "canary").write_text("kept\n")
    (log := tmp_path / "log").mkdir()
    (log / f".run_dir.tmp-{os.getpid()}").symlink_to(canary)
    rundir.point_to(tmp_path / "run", str(log / "run_dir"))
    assert canary.read_text() == "kept\n" and not (log / "run_dir").exists()
    if os.geteuid() == 0:
        planted = theirs(tmp_path / "theirs")
        rundir.point_to(tmp_path / "run", str(planted / "run_dir"))
        assert list(planted.iterdir()) == []
