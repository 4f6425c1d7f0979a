"""A token loss trained exactly on any number of ranks (issue 52, items 1 and 2).

scripts/token_lm.py, a small causal language model on variable-length sequences padded
per batch (labels -100 on the padding), AdamW, clipping at 1.0, 40 steps of 16 sequences,
at both API levels (the loop's user returns {"loss", "count"} from the loss; hapi's user
has a model that returns its own mean over the labels, with train.loss_count=labels):
- on 2 ranks x 2 micro-batches, its final weights are within 1e-6 of one process on the
  union of each step's micro-batches with the token mean (Σ NLL over the step's every
  non-pad token / their count), far from the mean of the micro-batches' means that fit()
  trained before; the same on 1 rank x 4 and 4 ranks x 1, which train on the same samples
  at every step (train.log_samples);
- every loss it reports is the step's over all ranks, the same on every rank;
- its eval loss, over the whole eval set weighed by the tokens, is one process's to 1e-9
  at 1, 2 and 4 ranks, and so is the perplexity.
"""

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from paddle_dist.runs.layout import Run

from ..oracles import max_difference
from .procs import ROOT, check, run

SCRIPTS = ROOT / "tests" / "integration" / "scripts"
SCRIPT = str(SCRIPTS / "token_lm.py")
APIS = ("loop", "hapi")
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def token_lm():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import token_lm
        yield token_lm
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """world size -> its launch's folder; the 2-rank loop run is the one every world size
    then evaluates (the same weights)."""
    found = {}
    for world in (2, 1, 4):
        out = tmp_path_factory.mktemp(f"token-lm{world}")
        check(run(["-m", "paddle_dist.launch", "--nprocs", str(world), "--log_dir", str(out / "log"), SCRIPT,
                   "--out", str(out), "--ref", str(found.get(2, out) / "loop")], cwd=out, timeout=300))
        found[world] = out
    return found


def _weights(out: Path, api: str, rank: int):
    arrays = dict(np.load(out / f"{api}-rank{rank}.npz"))
    return ({k[len("initial/"):]: v for k, v in arrays.items() if k.startswith("initial/")},
            {k: v for k, v in arrays.items() if not k.startswith("initial/")})


def _result(out: Path, api: str, rank: int) -> dict:
    return json.loads((out / f"{api}-rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def replays(runs, token_lm):
    """world size -> (token-mean replay's weights, its step losses); ("before", world): the
    mean of the micro-batches' means, as fit() trained before."""
    initial, _ = _weights(runs[2], "loop", 0)
    found = {world: token_lm.replay(initial, world) for world in (1, 2, 4)}
    found.update({("before", world): token_lm.replay(initial, world, mean_of_means=True) for world in (1, 2, 4)})
    return found


def test_every_world_size_equals_one_process_on_the_token_mean(runs, replays):
    measured = {}
    for world, out in runs.items():
        for api in APIS:
            initial, mine = _weights(out, api, 0)
            for rank in range(1, world):
                assert max_difference(mine, _weights(out, api, rank)[1]) == 0.0, (world, api, rank)
            measured[f"{world}x{4 // world} {api}"] = {
                "token mean": max_difference(mine, replays[world][0]),
                "mean of means (before)": max_difference(mine, replays["before", world][0]),
                "moved": max_difference(mine, initial)}
    print(json.dumps(measured, indent=1))
    for name, found in measured.items():
        assert found["token mean"] <= TOLERANCE, name
        assert found["mean of means (before)"] > 1000 * TOLERANCE, name      # what the weighting changes
    # The three plans train on the same samples at every step, so end alike within float rounding.
    assert max_difference(_weights(runs[1], "loop", 0)[1], _weights(runs[4], "hapi", 0)[1]) <= 2 * TOLERANCE


def _digests(run_dir: Path) -> list:
    return [line.split("\t")[3] for line in Run(run_dir).samples.read_text().splitlines() if not line.startswith("#")]


def test_the_same_samples_at_every_step_at_every_world_size(runs):
    reference = _digests(runs[2] / "loop")
    assert len(reference) == 40
    for world, out in runs.items():
        for api in APIS:
            assert _digests(out / api) == reference, (world, api)


def test_the_reported_losses_are_the_global_ones(runs, replays, token_lm):
    for world, out in runs.items():
        steps, counts = replays[world][1], token_lm.step_counts(world)   # Σ NLL / Σ count over every rank
        for api in APIS:
            results = [_result(out, api, rank) for rank in range(world)]
            assert all(r["losses"] == results[0]["losses"] for r in results), (world, api)
            np.testing.assert_allclose(results[0]["losses"], steps, rtol=1e-5, err_msg=f"{world} {api}")
            metrics = results[0]["metrics"]
            assert metrics["train_loss"] == pytest.approx(np.dot(steps, counts) / sum(counts), rel=1e-5)
            assert metrics["train_perplexity"] == pytest.approx(math.exp(metrics["train_loss"]), rel=1e-12)
            # Every progress line (every 5 steps): its steps' loss, Σ sums / Σ counts.
            logged = re.findall(r"step (\d+)/40 loss ([\d.]+)", Run(out / api).rank_log(0).read_text())
            assert [int(step) for step, _ in logged] == list(range(5, 41, 5)), (world, api)
            for step, loss in logged:
                window = slice(int(step) - 5, int(step))
                want = np.dot(steps[window], counts[window]) / sum(counts[window])
                assert float(loss) == pytest.approx(want, abs=5.1e-5), (world, api, step)


def test_the_eval_loss_is_one_processes_at_any_world_size(runs, token_lm):
    _, weights = _weights(runs[2], "loop", 0)
    want = token_lm.evaluate_one_process(weights)
    found = {world: json.loads((out / "eval-rank0.json").read_text()) for world, out in runs.items()}
    print(json.dumps({"one process": want, **{f"{w} ranks": f["eval_loss"] for w, f in found.items()}}))
    for world, metrics in found.items():
        assert metrics["eval_loss"] == pytest.approx(want, rel=1e-9), world
        assert metrics["eval_perplexity"] == pytest.approx(math.exp(want), rel=1e-9), world
        assert metrics["eval_count"] == token_lm.EVAL_SAMPLES


@pytest.mark.parametrize("mode", ["overlap", "dataparallel", "backend"])
def test_every_sync_mode_trains_on_the_token_mean(mode, runs, replays, tmp_path):
    """Where the exchange carries no rider (the count's own all-reduce, once per step)."""
    sync = {"overlap": ["sync.mode=overlap"], "dataparallel": ["sync.mode=dataparallel"],
            "backend": ["sync.mode=fused", "sync.transport=backend"]}[mode]
    check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"), SCRIPT,
               "--out", str(tmp_path), *[f"--override={o}" for o in sync]], cwd=tmp_path, timeout=300))
    for api in APIS:
        mine = _weights(tmp_path, api, 0)[1]
        assert max_difference(mine, _weights(tmp_path, api, 1)[1]) == 0.0, api
        assert max_difference(mine, replays[2][0]) <= TOLERANCE, api
        assert _result(tmp_path, api, 0)["losses"] == pytest.approx(replays[2][1], rel=1e-5), api
        assert f"sync {mode if mode != 'backend' else 'fused'}" in Run(tmp_path / api).rank_log(0).read_text()
