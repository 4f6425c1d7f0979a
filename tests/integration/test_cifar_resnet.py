"""ResNet-18 on CIFAR-shaped data with 2 real CPU ranks, at both API levels, started by
paddle_dist's launcher and by paddle.distributed.spawn; and the shipped CIFAR-10 config
on files in each of CIFAR-10's on-disk forms."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from paddle_dist import cifar
from paddle_dist.runs.layout import Run

from .procs import check, run
from ..oracles import rank_statuses, read_metrics

JOB = ["-c", "configs/cifar10_resnet18.yaml", "-o", "train.batch_size=4", "-o", "train.max_steps=3",
       "-o", "train.epochs=1", "-o", "train.eval_batch_size=8", "-o", "checkpoint.every_epochs=0",
       "-o", "train.log_every=1"]
SYNTHETIC = ["-o", "data.name=synthetic", "-o", "data.num_samples=64", "-o", "data.num_eval_samples=16"]
LAUNCHERS = {"launch": ["train.py", "-o", "dist.nprocs=2"],
             "spawn": ["tools/spawn_train.py", "--nprocs", "2"]}


def statuses(run_dir: Path):
    return rank_statuses(run_dir)


# Each launcher and each API level once (the other pairings: test_own_fit, test_faults).
@pytest.mark.parametrize("launcher, api", [("launch", "loop"), ("spawn", "hapi")])
def test_resnet18_trains_on_2_ranks_with_identical_weights(tmp_path, launcher, api):
    run_dir = tmp_path / "run"
    check(run(LAUNCHERS[launcher] + JOB + SYNTHETIC + [
        "-o", f"train.api={api}", "-o", f"output.run_dir={run_dir}"], timeout=240))
    ranks = statuses(run_dir)
    assert [s["state"] for s in ranks] == ["done", "done"]
    # parameters and BatchNorm statistics (averaged at the epoch's end), bit for bit
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    metrics = read_metrics(run_dir)
    assert (metrics["steps"], metrics["world_size"], metrics["test_samples"]) == (3, 2, 16)
    log = Run(run_dir).rank_log(0).read_text()
    # lr 0.1 for 256 samples, linear scaling to 4 x 2 = 8: 0.003125, warmed up over 2 epochs
    assert "lr 0.003125: 0.1 for a global batch of 256, linear scaling to 8" in log
    rates = [float(r) for r in re.findall(r"step \d+/\d+ loss \S+ lr (\S+)", log)]
    assert rates == pytest.approx([0.003125 * s / 16 for s in (1, 2, 3)], rel=1e-2)  # 8 steps/epoch


@pytest.mark.parametrize("form", cifar.FORMS)
def test_the_cifar10_config_reads_every_form(tmp_path, form):
    root = cifar.write_fake(tmp_path / "data", form, num_train=40, num_test=10)
    run_dir = tmp_path / "run"
    check(run(["train.py"] + JOB + ["-o", f"data.root={root}", "-o", f"output.run_dir={run_dir}",
                                     "-o", "train.max_steps=2"], timeout=240))
    metrics = read_metrics(run_dir)
    assert (metrics["steps"], metrics["test_samples"]) == (2, 10)
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    assert Run(run_dir).best.is_dir()                 # the only epoch is the best so far


def test_best_checkpoint_and_early_stop_agree_on_every_rank(tmp_path):
    """lr 0 never improves after the first epoch: patience 1 stops both ranks after epoch 2."""
    run_dir = tmp_path / "run"
    check(run(["train.py", "-o", "dist.nprocs=2", "-c", "configs/synthetic_lenet.yaml",
               "-o", "data.num_samples=128", "-o", "data.num_eval_samples=64", "-o", "train.epochs=5",
               "-o", "train.batch_size=16", "-o", "train.lr=1e-12", "-o", "checkpoint.monitor=eval_loss",
               "-o", "train.early_stop_patience=1", "-o", f"output.run_dir={run_dir}"], timeout=240))
    metrics = read_metrics(run_dir)
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    ranks = statuses(run_dir)
    assert ranks[0]["step"] == ranks[1]["step"] == 2 * 4
    best = json.loads((Run(run_dir).best / "ckpt_000000004" / "meta.json").read_text())
    assert best["epoch"] == 1
    assert "early stop after epoch 2" in Run(run_dir).rank_log(0).read_text()
    assert np.isfinite(metrics["test_loss"])
