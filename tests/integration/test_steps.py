"""Steps instead of epochs, as Paddle's suites count them (`iters: 40`): train.max_steps
sets the run's length over as many epochs as it fills, train.eval_every_steps evaluates
mid-epoch (the best checkpoint and checkpoint.monitor on those evaluations), and a run
killed between two evaluations continues to the same history and the same best weights.
"""

from pathlib import Path

import numpy as np
import pytest

from paddle_dist.runs.layout import Run

from ..oracles import latest_checkpoint, read_metrics
from .procs import run

# 4000 samples, 2 ranks of 64: 32 steps an epoch; 40 steps fill 2 epochs of train.epochs=1.
JOB = ["train.py", "-c", "configs/mnist_mlp.yaml", "-o", "dist.nprocs=2", "-o", "train.epochs=1",
       "-o", "train.max_steps=40", "-o", "train.batch_size=64", "-o", "train.eval_every_steps=15",
       "-o", "checkpoint.every_steps=5", "-o", "checkpoint.monitor=eval_accuracy", "-o", "train.log_every=10"]


def _job(out: Path, *extra: str):
    return run(JOB + ["-o", f"output.run_dir={out}", *extra], timeout=240)


def _best(out: Path) -> dict:
    folder = latest_checkpoint(out, best=True)
    return dict(np.load(folder / "model.npz"))


@pytest.mark.compat
def test_steps_and_evaluations_every_n_steps_continue_exactly_after_a_kill(tmp_path):
    clean = tmp_path / "clean"
    done = _job(clean)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "epoch 1/2 step 20/32 loss" in said and "; step 20/40" in said      # steps of the total
    assert "step 30/40: eval loss" in said and "best eval_accuracy" in said and "evaluations" in said
    history = read_metrics(clean)["history"]
    assert [h.get("step") for h in history if "eval_count" in h] == [15, 30, 40]
    assert [h["epoch"] for h in history if "train_loss" in h] == [1, 2]
    assert read_metrics(clean)["steps"] == 40
    for api in ("loop",):         # the step evaluations are the Session's, at both levels alike
        out = tmp_path / api
        killed = _job(out, "-o", f"train.api={api}", "-o", "faults.inject=kill:1:20")
        assert killed.returncode != 0
        done = _job(out, "-o", f"train.api={api}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "resuming from" in Run(out).rank_log(0).read_text()
        resumed = read_metrics(out)["history"]
        assert resumed == history, api            # the same evaluations, losses and epochs
        best, want = _best(out), _best(clean)
        assert best.keys() == want.keys() and all(np.array_equal(best[k], want[k]) for k in want), api
