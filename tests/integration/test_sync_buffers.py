"""`python -m paddle_dist.launch --sync-buffers` on a plain script: its paddle.DataParallel
keeps BatchNorm statistics equal on every rank, so the metric the ranks sum is the saved
model's; rank 0 says once which of the two it is.

The script (scripts/bn_plain.py) trains a BatchNorm CNN on 2 ranks, each rank evaluates
its shard of the eval set, rank 0 prints the all-reduced sums and saves its weights; the
saved weights are then scored in one plain process.
"""

import json

import numpy as np
import pytest

from .procs import ROOT, check, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "bn_plain.py")
WARNING = "each rank keeps its own BatchNorm statistics"
SYNCING = "paddle_dist: --sync-buffers: the statistics of"


def launched(tmp_path, *options):
    result = check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"),
                        *options, SCRIPT, "--out", str(tmp_path)], timeout=240))
    [line] = [line for line in result.stdout.splitlines() if line.startswith("METRIC ")]
    printed = json.loads(line[len("METRIC "):])
    check(run([SCRIPT, "--score", str(tmp_path / "model.pdparams"), "--out", str(tmp_path)], timeout=120))
    saved = json.loads((tmp_path / "score.json").read_text())
    stats = [dict(np.load(tmp_path / f"buffers{rank}.npz")) for rank in (0, 1)]
    assert sorted(stats[0]) == ["1._mean", "1._variance", "4._mean", "4._variance"]
    return result, printed, saved, stats


def test_with_the_option_every_rank_has_the_statistics_and_the_metric_is_the_saved_models(tmp_path):
    result, printed, saved, (rank0, rank1) = launched(tmp_path, "--sync-buffers")
    for name in rank0:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)     # bitwise
    # Every rank evaluated its shard with the weights and statistics rank 0 saved: the summed
    # metric is the saved model's on the whole set (the loss to the rounding of a sum).
    assert printed["correct"] == saved["correct"]
    assert printed["loss"] == pytest.approx(saved["loss"], rel=1e-6)
    assert WARNING not in result.stdout + result.stderr
    said = [line for line in (result.stdout + result.stderr).splitlines() if SYNCING in line]
    assert len(said) == 1 and "2 BatchNorm layers" in said[0], said      # rank 0, once


def test_without_it_the_ranks_differ_and_rank_0_says_so_once(tmp_path):
    result, printed, saved, (rank0, rank1) = launched(tmp_path)
    assert any(not np.array_equal(rank0[name], rank1[name]) for name in rank0)
    assert printed["loss"] != pytest.approx(saved["loss"], rel=1e-4)      # the metric of no saved model
    said = [line for line in (result.stdout + result.stderr).splitlines() if WARNING in line]
    assert len(said) == 1 and "--sync-buffers" in said[0], said


def test_a_data_parallel_that_fit_makes_is_left_to_fit(tmp_path):
    """fit() keeps the statistics equal itself (one update per optimizer step), so the
    launcher's hook leaves its DataParallel alone: no warning (the option not given), no
    second update per forward (which --sync-buffers would add)."""
    result = check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"), "-o", f"output.root={tmp_path / 'runs'}",
                        str(ROOT / "tests" / "integration" / "scripts" / "bn_fit.py"), str(tmp_path)],
                       timeout=240))
    assert WARNING not in result.stdout + result.stderr
    rank0, rank1 = [dict(np.load(tmp_path / f"buffers{rank}.npz")) for rank in (0, 1)]
    for name in rank0:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
