"""The whole state, not only the weights: a detector-like fit() script (BatchNorm, a
DataLoader with 2 workers, an eval metric, an EMA) on 2 ranks.

- what is evaluated is one model: an EMA callback over the whole state_dict evaluates the
  same averages on every rank, and its metric is one process's on them; an EMA of
  per-rank state stops the job with exit 7 and the line, before any metric;
- train.ema_decay averages the BatchNorm statistics too, and its metric is one process's
  on the exported averages;
- killed (SIGKILL of a rank), stopped (SIGTERM) or interrupted (Ctrl+C) mid-epoch and
  continued by the same command, a run ends bitwise equal to the uninterrupted one in
  every checkpoint file (model, EMA, optimizer, random generators) and the best
  checkpoint, at both API levels; the interrupted epoch's train loss covers the epoch.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from paddle_dist.runs.layout import Run

from ..oracles import References, checkpoint_arrays, differing, latest_checkpoint, max_difference, read_metrics
from .procs import ROOT, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "whole_state.py")
EMA = ["-o", "train.ema_decay=0.9", "-o", "checkpoint.every_steps=5", "-o", "train.log_samples=true"]


def _job(out: Path, *extra: str, script_args=(), ranks: int = 2):
    out.mkdir(parents=True, exist_ok=True)
    return run(["-m", "paddle_dist.launch", "--nprocs", str(ranks), "--log_dir", str(out / "log"),
                "-o", f"output.run_dir={out / 'run'}", *extra, SCRIPT, str(out), *script_args],
               cwd=out, timeout=240)


def _one_process(weights: Path) -> dict:
    done = run([SCRIPT, "evaluate", str(weights)], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_ema_callback_over_the_whole_state_evaluates_one_model(tmp_path):
    out = tmp_path / "suite"
    done = _job(out, script_args=["--callback-ema", "suite"])
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [np.load(out / f"evaluated{r}.npz") for r in (0, 1)]
    assert ranks[0].files == ranks[1].files and any(k.endswith("_mean") for k in ranks[0].files)
    assert all(np.array_equal(ranks[0][k], ranks[1][k]) for k in ranks[0].files)
    reported = json.loads((out / "result0.json").read_text())
    assert reported["eval_acc"] == _one_process(out / "evaluated0.npz")["acc"]


def test_an_ema_callback_of_per_rank_state_ends_with_exit_7_before_any_metric(tmp_path):
    done = _job(tmp_path / "per-rank", script_args=["--callback-ema", "per-rank"])
    assert done.returncode == 7, done.stderr[-3000:]
    assert "the ranks would evaluate different weights after step 16" in done.stderr
    assert "use train.ema_decay" in done.stderr
    assert "eval loss" not in done.stdout + done.stderr         # no metric of no model


# fused: BatchNorm's sums travel with the gradients (shared memory); overlap and
# dataparallel: in an all-reduce of their own.
@pytest.mark.parametrize("mode", ["fused", "overlap", "dataparallel"])
def test_train_ema_averages_batchnorm_statistics_and_its_metric_is_the_exported_averages(mode, tmp_path):
    out = tmp_path / "ema"
    done = _job(out, *EMA, "-o", f"sync.mode={mode}")
    assert done.returncode == 0, done.stderr[-3000:]
    last = latest_checkpoint(out / "run")
    averaged, trained = np.load(last / "ema.npz"), np.load(last / "model.npz")
    means = [k for k in averaged.files if k.endswith("_mean")]
    assert means and all(not np.array_equal(averaged[k], trained[k]) for k in means)
    # load_weights: the averages
    assert read_metrics(out / "run")["test_metrics"]["acc"] == _one_process(out / "run")["acc"]
    evaluated = np.load(out / "evaluated0.npz")      # what the model held while evaluated
    assert all(np.array_equal(evaluated[k], averaged[k]) for k in means)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The output folders of clean runs, per API level."""
    def make(out: Path, api: str) -> Path:
        done = _job(out, *EMA, "-o", f"train.api={api}")
        assert done.returncode == 0, done.stderr[-3000:]
        return out
    return References(tmp_path_factory, "clean", make)


# Step 23 of 32 (epoch 2 of 2, 16 steps each): the last checkpoint before it is step 20.
STOPS = {"kill": ("kill:1:23", -9), "term": ("term:0:23", 75), "interrupt": ("interrupt:0:23", 130)}


@pytest.mark.compat
@pytest.mark.parametrize("api", ["loop", "hapi"])
@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_stopped_run_continues_bitwise_in_the_whole_state(uninterrupted, api, stop, tmp_path):
    clean = uninterrupted[api]
    out = tmp_path / stop
    fault, code = STOPS[stop]
    first = _job(out, *EMA, "-o", f"train.api={api}", "-o", f"faults.inject={fault}")
    assert first.returncode != 0 and (code < 0 or first.returncode == code), first.stderr[-3000:]
    done = _job(out, *EMA, "-o", f"train.api={api}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in Run(out / "run").rank_log(0).read_text()
    for best in (False, True):
        a, b = (checkpoint_arrays(latest_checkpoint(o / "run", best)) for o in (clean, out))
        assert a.keys() == b.keys() and any(k.startswith("ema.npz:") and k.endswith("_variance") for k in a)
        assert differing(a, b) == []
    ran, resumed = (read_metrics(o / "run")["history"] for o in (clean, out))
    assert [h["epoch"] for h in ran] == [h["epoch"] for h in resumed] == [1, 2]
    for a, b in zip(ran, resumed):      # the interrupted epoch's loss covers all its steps
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-9)
        assert b["eval_acc"] == a["eval_acc"] and b["eval_loss"] == a["eval_loss"]


def _samples(out: Path) -> dict:
    """global step -> the digests of its samples that the run's attempts logged."""
    found: dict = {}
    for line in Run(out / "run").samples.read_text().splitlines():
        if line.startswith("#"):      # an attempt's mark
            continue
        step, _, _, digest = line.split("\t")
        found.setdefault(int(step), set()).add(digest)
    return found


def _same_samples(clean: Path, out: Path) -> None:
    """Every optimizer step trained on the uninterrupted run's samples (the steps redone
    after the kill included)."""
    a, b = _samples(clean), _samples(out)
    assert sorted(a) == sorted(b) == list(range(1, len(a) + 1))
    assert all(len(a[step]) == 1 and b[step] == a[step] for step in a)


def _within_rounding(clean: Path, out: Path, best: bool = False) -> None:
    """Every weight, buffer, average and optimizer entry of the two runs' latest checkpoint
    within 1e-6 (the random generators' states aside: another number of ranks draws alike
    only in the data, sampling.SeededSamples)."""
    a, b = (checkpoint_arrays(latest_checkpoint(folder / "run", best)) for folder in (clean, out))
    assert max_difference({k: v for k, v in a.items() if not k.startswith("rng")},
                           {k: v for k, v in b.items() if not k.startswith("rng")}) <= 1e-6


# A run continued on another number of ranks keeps its data plan (trainer/sampling.py): the
# same micro-batches in every optimizer step, so the same run within float rounding.
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_a_killed_two_rank_run_continues_on_one_rank_within_float_rounding(uninterrupted, api, tmp_path):
    clean, out = uninterrupted[api], tmp_path / "one"
    first = _job(out, *EMA, "-o", f"train.api={api}", "-o", "faults.inject=kill:1:23")
    assert first.returncode != 0, first.stderr[-3000:]
    done = _job(out, *EMA, "-o", f"train.api={api}", ranks=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing on 1 rank (was 2): 2 micro-batches per step keep the global batch of 16" in done.stdout
    _same_samples(clean, out)
    for best in (False, True):
        _within_rounding(clean, out, best)
    ran, resumed = (read_metrics(o / "run")["history"] for o in (clean, out))
    for a, b in zip(ran, resumed):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-6)
        assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-6) and b["eval_acc"] == a["eval_acc"]


def test_two_ranks_of_two_micro_batches_continue_on_four_ranks_of_one(tmp_path):
    accumulate = ["-o", "train.accumulate_steps=2"]
    clean, out = tmp_path / "clean", tmp_path / "four"
    assert _job(clean, *EMA, *accumulate).returncode == 0
    first = _job(out, *EMA, *accumulate, "-o", "faults.inject=kill:1:11")
    assert first.returncode != 0
    done = _job(out, *EMA, *accumulate, ranks=4)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing on 4 ranks (was 2): 1 micro-batch per step keep the global batch of 32" in done.stdout
    _same_samples(clean, out)
    _within_rounding(clean, out)


def test_four_ranks_killed_continue_on_two_then_killed_again_continue_on_one(tmp_path):
    """The run planned for 4 ranks keeps its steps on 2 ranks (2 micro-batches each), then
    on 1 (4 micro-batches): the same samples in every step, the same end within 1e-6."""
    clean, out = tmp_path / "clean", tmp_path / "shrinking"
    assert _job(clean, *EMA, ranks=4).returncode == 0
    assert _job(out, *EMA, "-o", "faults.inject=kill:1:6", ranks=4).returncode != 0
    assert _job(out, *EMA, "-o", "faults.inject=kill:1:13", ranks=2).returncode != 0
    done = _job(out, *EMA, ranks=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing on 1 rank (was 4): 4 micro-batches per step keep the global batch of 32" in done.stdout
    _same_samples(clean, out)
    _within_rounding(clean, out)
