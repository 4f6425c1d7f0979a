"""python -m paddle_dist.runs: recent runs and their states, from real status records
(written by monitor.Monitor, as training writes them) and checkpoint folders."""

import json
import subprocess
import sys
from types import SimpleNamespace

from paddle_dist.runs.layout import LATEST, Run, checkpoint_name
from paddle_dist.runtime import monitor as rank_monitor
from paddle_dist.runs import listing


def _record(run_dir, rank, state, pid=None, step=0, error=None, when=None):
    env = SimpleNamespace(global_rank=rank, local_rank=rank)
    monitor = rank_monitor.Monitor(env, run_dir)
    monitor.step_no, monitor.epoch = step, 1     # in the first epoch (1-based, as printed)
    monitor.finish(state, error)
    if pid is not None or when is not None:      # a rank that is (or was) another process
        path = Run(run_dir).rank_status(rank)
        record = json.loads(path.read_text())
        record.update({k: v for k, v in (("pid", pid), ("time", when)) if v is not None})
        path.write_text(json.dumps(record))


def _run_dir(root, name, *ranks, finished=False, checkpoint=None, when=None):
    run_dir = root / name
    run_dir.mkdir(parents=True)
    Run(run_dir).config.write_text("train: {}\n")
    for rank, (state, kwargs) in enumerate(ranks):
        _record(run_dir, rank, state, when=when, **kwargs)
    if finished:
        Run(run_dir).metrics.write_text("{}")
    if checkpoint is not None:
        folder = Run(run_dir).checkpoints / checkpoint_name(checkpoint)
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps({"global_step": checkpoint}))
        (Run(run_dir).checkpoints / LATEST).write_text(folder.name)
    return run_dir


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_every_state_from_real_status_records(tmp_path):
    root = tmp_path / "runs"
    _run_dir(root, "done", ("done", {"step": 40}), ("done", {"step": 40}), finished=True,
             checkpoint=40, when=100.0)
    _run_dir(root, "failed", ("stopped", {"error": RuntimeError("peer")}),
             ("failed", {"error": ValueError("boom")}), checkpoint=20, when=200.0)
    _run_dir(root, "preempted", ("preempted", {}), ("preempted", {}), when=300.0)
    _run_dir(root, "killed", ("running", {"pid": _dead_pid()}), when=400.0)
    _run_dir(root, "running", ("running", {"pid": 1}), when=500.0)   # pid 1 is alive
    (root / "never-trained").mkdir()
    Run(root / "never-trained").config.write_text("train: {}\n")
    (root / "not-a-run").mkdir()                                      # no config.yaml
    found = {run["run"].rsplit("/", 1)[1]: run for run in listing.recent(root, 10)}
    assert {name: run["state"] for name, run in found.items()} == {
        "done": "done", "failed": "failed", "preempted": "preempted", "killed": "failed",
        "running": "running", "never-trained": "unknown"}
    assert found["done"]["step"] == 40 and found["done"]["checkpoint_step"] == 40
    assert found["done"]["last_checkpoint"].endswith("ckpt_000000040")
    assert found["preempted"]["last_checkpoint"] is None
    # Newest first (the last record written; never-trained: its directory's time, now).
    assert [r["run"].rsplit("/", 1)[1] for r in listing.recent(root, 10)] == \
        ["never-trained", "running", "killed", "preempted", "failed", "done"]
    assert len(listing.recent(root, 2)) == 2


def test_an_unfinished_run_comes_with_the_command_that_continues_it(tmp_path):
    root = tmp_path / "runs"
    for name, state, finished in (("failed", "failed", False), ("done", "done", True)):
        run_dir = _run_dir(root, name, (state, {}), finished=finished)
        Run(run_dir).run_file.write_text(json.dumps(
            {"command": ["python", "train.py", "-o", "dist.nprocs=2"], "same_command_continues": True}))
    found = {run["run"].rsplit("/", 1)[1]: run for run in listing.recent(root, 10)}
    assert found["failed"]["resume"] == "python train.py -o dist.nprocs=2"
    assert found["done"]["resume"] == ""


def test_the_command_prints_a_table_or_json_and_refuses_a_missing_root(tmp_path, capsys):
    root = tmp_path / "runs"
    _run_dir(root, "done", ("done", {"step": 7}), finished=True, checkpoint=7)
    assert listing.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["run", "state", "step", "epoch", "last", "checkpoint", "updated"]
    assert out[1].split()[1:5] == ["done", "7", "1", "ckpt_000000007"]   # epoch 1-based
    assert listing.main(["--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["state"] == "done"
    assert listing.main(["--root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run directory" in err[0] and "--root" in err[0]
    assert listing.main(["--root", str(root), "-n", "0"]) == 2


def test_the_command_runs_where_paddle_is_not_installed(tmp_path, without_paddle):
    """runs/ reads runs with the standard library: `python -m paddle_dist.runs` in a fresh
    interpreter whose `import paddle` fails as on a machine without it lists a run, its
    step and its latest checkpoint."""
    root = tmp_path / "runs"
    _run_dir(root, "failed", ("failed", {"step": 12, "error": RuntimeError("boom")}), checkpoint=10)
    done = without_paddle("-m", "paddle_dist.runs", "--root", str(root), "--json")
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)
    assert (run["state"], run["step"], run["checkpoint_step"]) == ("failed", 12, 10)
    assert run["last_checkpoint"].endswith("ckpt_000000010")
    check = without_paddle("-c", "import paddle")
    assert "No module named 'paddle'" in check.stderr         # the stand-in does stand in
