"""A user's optimizer with its own LRScheduler is stepped by one rule at both API levels:
after every optimizer step (train.scheduler_every=step; once per train.accumulate_steps
micro-batches) or after every epoch (train.scheduler_every=epoch), before the checkpoint of
that step or epoch, so that a resumed run continues the schedule.

The script (scripts/own_scheduler.py) runs, on 2 ranks under `python -m paddle_dist.launch`,
a per-step ExponentialDecay (with 2 micro-batches a step), a per-epoch MultiStepDecay, and
each of them again from a checkpoint; it records `optimizer.get_lr()` at every training
forward and `Result.losses`.
"""

import json

import pytest

from .procs import ROOT, check, run

pytestmark = pytest.mark.compat

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "own_scheduler.py")
# 2 ranks x 32 samples: 8 micro-batches an epoch, 3 epochs, 12 optimizer steps either way.
STEP_LRS = [0.1 * 0.9 ** (i // 2) for i in range(24)]        # per micro-batch, 2 a step
EPOCH_LRS = [0.1 * 0.5 ** (s // 4) for s in range(12)]        # per step, 4 an epoch
START_LINES = (
    "paddle_dist: lr from the optimizer's own ExponentialDecay, 0.1 at the start, "
    "stepped after every optimizer step (train.scheduler_every=step)",
    "paddle_dist: lr from the optimizer's own MultiStepDecay, 0.1 at the start, "
    "stepped after every epoch (train.scheduler_every=epoch)")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """{api: (launcher stdout, [what rank 0 recorded, what rank 1 recorded])}."""
    found = {}
    for api in ("loop", "hapi"):
        tmp = tmp_path_factory.mktemp(api)
        result = check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp / "log"),
                            SCRIPT, "--out", str(tmp), "--root", str(tmp / "runs"), "--api", api],
                           timeout=180))
        found[api] = result.stdout, [json.loads((tmp / f"{api}-rank{r}.json").read_text())
                                     for r in range(2)]
    return found


@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_the_users_scheduler_is_stepped_per_step_or_per_epoch_as_configured(recorded, api):
    stdout, ranks = recorded[api]
    for line in START_LINES:
        assert line in stdout, stdout[-3000:]
    for fits in ranks:
        assert fits["step"]["lrs"] == pytest.approx(STEP_LRS, rel=1e-12)
        assert fits["epoch"]["lrs"] == pytest.approx(EPOCH_LRS, rel=1e-12)
        assert fits["step"]["steps"] == fits["epoch"]["steps"] == 12


def test_both_api_levels_train_the_same_losses(recorded):
    for loop, hapi in zip(recorded["loop"][1], recorded["hapi"][1]):
        for name in ("step", "epoch", "step_resume", "epoch_resume"):
            assert hapi[name]["lrs"] == loop[name]["lrs"], name
            assert hapi[name]["losses"] == pytest.approx(loop[name]["losses"], rel=0, abs=1e-6), name


@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_a_resumed_run_continues_the_schedule(recorded, api):
    """From the step-6 checkpoint (mid-epoch, per-step rule) and the step-8 one (an epoch's
    end, per-epoch rule): the rest of the uninterrupted run's rates and losses."""
    for fits in recorded[api][1]:
        assert fits["step_resume"]["lrs"] == fits["step"]["lrs"][12:]
        assert fits["step_resume"]["losses"] == pytest.approx(fits["step"]["losses"][6:], rel=0, abs=1e-6)
        assert fits["epoch_resume"]["lrs"] == fits["epoch"]["lrs"][8:]
        assert fits["epoch_resume"]["losses"] == pytest.approx(fits["epoch"]["losses"][8:], rel=0, abs=1e-6)
        assert fits["step_resume"]["steps"] == fits["epoch_resume"]["steps"] == 12
