"""Unit tests for paddle_dist.runs.layout: every path inside a run directory, and which
checkpoint is the latest."""

from pathlib import Path

from paddle_dist.runs import layout
from paddle_dist.runs.layout import Run


def test_a_runs_paths():
    run = Run("runs/mnist-1")
    assert run.root == Path("runs/mnist-1")
    assert run.rank_log(3) == Path("runs/mnist-1/logs/rank3.log")
    assert run.rank_status(1).parent == Path("runs/mnist-1/status")
    assert run.checkpoints == Path("runs/mnist-1/checkpoints") and run.best == Path("runs/mnist-1/best")


def test_the_launch_logs_are_per_machine_in_a_multi_node_job():
    run = Run(Path("/r/x"))
    assert run.launch_logs() == Path("/r/x/launch")
    assert run.launch_logs(nnodes=1, node_rank=0) == Path("/r/x/launch")
    assert run.launch_logs(nnodes=3, node_rank=2) == Path("/r/x/launch-node2")


def test_latest_is_the_named_checkpoint_else_the_newest(tmp_path):
    assert layout.latest(tmp_path) is None
    for step in (40, 120, 80):
        (tmp_path / layout.checkpoint_name(step)).mkdir()
    assert layout.latest(tmp_path) == tmp_path / "ckpt_000000120"     # no `latest` file: a crash
    (tmp_path / layout.LATEST).write_text("ckpt_000000080\n")
    assert layout.latest(tmp_path) == tmp_path / "ckpt_000000080"
    (tmp_path / layout.LATEST).write_text("../elsewhere\n")            # not a name inside the root
    assert layout.latest(tmp_path) == tmp_path / "ckpt_000000120"


def test_a_checkpoint_knows_its_run(tmp_path):
    run = Run(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    checkpoint = run.checkpoints / layout.checkpoint_name(5)
    assert Run.of_checkpoint(checkpoint) is None                      # not a run yet: no config
    run.config.write_text("train: {}\n")
    assert Run.of_checkpoint(checkpoint) == run
    assert Run.of_checkpoint(tmp_path / "ckpt_000000005") is None
