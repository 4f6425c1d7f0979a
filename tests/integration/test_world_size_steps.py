"""A step-based run (train.max_steps) continued on another number of ranks ends where the
uninterrupted run ends, within float rounding of it, dropout included.

The model is BiSeNetV2's shape in small: BatchNorm in the body, a Dropout before the head.
The run's length is its steps whatever the world size of each attempt (trainer/prepare.py:
the epochs those steps fill are the run's plan's), and each micro-batch draws its dropout
masks from (train.seed, step, its place in the plan) (trainer/randomness.py), so 2 -> 1,
4 -> 2 and 1 -> 2 continuations train the uninterrupted run's samples with its masks.
"""

import json
from pathlib import Path

import pytest

from .procs import run
from .test_whole_state import EMA, _job, _same_samples, _within_rounding

DROPOUT = ["--dropout", "0.3"]


def _steps(out: Path, max_steps: int, *extra: str, ranks: int, api: str = "loop"):
    """The whole_state script at `ranks` ranks for `max_steps` steps (256 samples of 8 per
    rank: 16 steps an epoch on 2 ranks, 8 on 4, 32 micro-batches on 1)."""
    return _job(out, *EMA, "-o", f"train.max_steps={max_steps}", "-o", f"train.api={api}", *extra,
                script_args=DROPOUT, ranks=ranks)


def _finished(out: Path, steps: int) -> dict:
    metrics = json.loads((out / "run" / "metrics.json").read_text())
    assert metrics["steps"] == steps
    listed = run(["-m", "paddle_dist.runs", "--root", str(out), "--json"], timeout=60)
    assert listed.returncode == 0, listed.stderr[-2000:]
    (entry,) = json.loads(listed.stdout)
    assert (entry["state"], entry["step"]) == ("done", steps)
    return metrics


def _continued(tmp_path: Path, max_steps: int, first: int, then: int, stop: str, *extra: str,
               api: str = "loop"):
    """The uninterrupted run at `first` ranks, and one stopped by `stop` there and continued
    by the same command at `then` ranks: both end at `max_steps`, within 1e-6."""
    clean, out = tmp_path / "clean", tmp_path / "continued"
    done = _steps(clean, max_steps, *extra, ranks=first, api=api)
    assert done.returncode == 0, done.stderr[-3000:]
    stopped = _steps(out, max_steps, *extra, "-o", f"faults.inject={stop}", ranks=first, api=api)
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    done = _steps(out, max_steps, *extra, ranks=then, api=api)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"continuing on {then} rank" in done.stdout and "dropout in 'drop' draws per micro-batch" in done.stdout
    ran, resumed = _finished(clean, max_steps), _finished(out, max_steps)
    _same_samples(clean, out)
    _within_rounding(clean, out)
    assert len(ran["history"]) == len(resumed["history"])
    for a, b in zip(ran["history"], resumed["history"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-6)
        assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-6)


@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_a_stopped_two_rank_step_run_with_dropout_ends_on_one_rank_where_it_would_have(api, tmp_path):
    """SIGTERM at step 23 of 40 (2 ranks, 16 steps an epoch), continued on 1 rank (2
    micro-batches a step): 40 steps, not the 32 that 1 rank's epochs would hold."""
    _continued(tmp_path, 40, 2, 1, "term:0:23", api=api)
    assert "epoch 3/3 done" in (tmp_path / "continued" / "run" / "logs" / "rank0.log").read_text()


def test_a_killed_four_rank_step_run_ends_on_two_ranks_where_it_would_have(tmp_path):
    """4 ranks (8 steps an epoch), killed at step 11 of 20, continued on 2 ranks (2
    micro-batches each): 20 steps in 3 epochs, not 2 ranks' 16-step epochs."""
    _continued(tmp_path, 20, 4, 2, "kill:1:11")


def test_a_one_rank_step_run_of_two_micro_batches_ends_on_two_ranks_where_it_would_have(tmp_path):
    """1 rank of 2 micro-batches a step, stopped at step 23 of 40, continued on 2 ranks of 1."""
    _continued(tmp_path, 40, 1, 2, "term:0:23", "-o", "train.accumulate_steps=2")
