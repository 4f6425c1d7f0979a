"""The ranks check each other, with real processes: one rank's weights are perturbed after
step 3 (`-o faults.inject=perturb:1:3`), and the check of the checkpoint at step 4 ends the
job with exit 7, one line naming the parameter and the ranks, nothing written of step 4 or
later, and no offer to continue the run; the same command again starts a new run, whose
ranks agree at every checkpoint, and ends with 0.

Every job runs in its own session (procs.py) and is bounded by a timeout.
"""

import json

import pytest

from paddle_dist.runs import commands, listing
from paddle_dist.runs.layout import Run

from ..oracles import rank_statuses
from .procs import check, run

# LinearNet on 2,048 random samples: 2 ranks x 32 = 32 steps an epoch; checkpoints at 2, 4, 6.
JOB = ["-c", "configs/linear.yaml", "-o", "checkpoint.every_steps=2", "-o", "train.max_steps=8"]
TWO_RANKS = {"launch": ["train.py", "-o", "dist.nprocs=2"],
             "spawn": ["tools/spawn_train.py", "--nprocs", "2"]}
LINE = ("paddle_dist: job failed (exit 7). Root cause: the ranks' weights differ at step 4: "
        "'linear1.weight' is one value on rank 0 and another on rank 1; data parallelism broke "
        "(docs/faults.md)")


def _checkpoint_steps(run_dir):
    return sorted(json.loads((d / "meta.json").read_text())["global_step"]
                  for d in Run(run_dir).checkpoints.glob("ckpt_*"))


def _states(run_dir):
    return rank_statuses(run_dir)


@pytest.mark.parametrize("launcher, api", [
    pytest.param("launch", "loop", marks=pytest.mark.compat),
    pytest.param("spawn", "hapi", marks=pytest.mark.compat),
])
def test_ranks_whose_weights_differ_end_the_job_with_exit_7(launcher, api, tmp_path):
    command = TWO_RANKS[launcher] + JOB + ["-o", f"train.api={api}", "-o", f"output.root={tmp_path}"]
    result = run(command + ["-o", "faults.inject=perturb:1:3"], timeout=120)
    said = result.stdout + result.stderr
    assert result.returncode == 7, said[-4000:]
    assert said.splitlines().count(LINE) == 1, said[-4000:]
    assert "differ at step" not in said.replace(LINE, ""), "one line, said once"
    assert "to continue this run" not in said and "to run it again" not in said
    (run_dir,) = tmp_path.glob("linear-*")
    assert _checkpoint_steps(run_dir) == [2] and not Run(run_dir).best.exists()
    assert [(r["state"], r["exit_code"], r["step"]) for r in _states(run_dir)] == [("diverged", 7, 4)] * 2
    assert listing.describe(run_dir)["state"] == "diverged" and commands.resume_command(run_dir) == ""

    # The same command (an injected fault does not make it another job): a new run.
    again = check(run(command, timeout=120))
    assert f"not continuing the last run of this config, {run_dir}: its ranks' weights diverged" \
        in again.stdout
    (new,) = set(tmp_path.glob("linear-*")) - {run_dir}
    assert _checkpoint_steps(new)[-1] == 8               # every check passed, the last at step 8
    assert [r["state"] for r in _states(new)] == ["done", "done"]
