"""What a run leaves behind (trainer/outcome.py): the config as it ran, metrics.json."""

import json

from paddle_dist import config as configlib
from paddle_dist.runtime.env import DistEnv
from paddle_dist.trainer.outcome import as_ran, write_metrics
from paddle_dist.trainer.parts import Result


def test_the_config_as_run_names_its_ranks_and_no_run_directory():
    cfg = configlib.with_overrides(["output.run_dir=/x/run"])
    ran = as_ran(cfg, DistEnv(world_size=4, local_world_size=2, nnodes=2, master="10.0.0.1:6170",
                              launcher="paddle_launch"))
    assert (ran.output.run_dir, ran.dist.nprocs, ran.dist.nnodes, ran.dist.master, ran.dist.launcher) == \
        ("", 2, 2, "10.0.0.1:6170", "launch")
    assert cfg.output.run_dir == "/x/run"         # derived, the given one unchanged


def test_metrics_json_leaves_out_what_does_not_apply(tmp_path):
    result = Result(run_dir=tmp_path, history=[{"epoch": 1, "train_loss": 0.5, "eval_loss": 0.4,
                                                "eval_count": 10}], steps=7)
    write_metrics(tmp_path, result, configlib.with_overrides([]), DistEnv())
    found = json.loads((tmp_path / "metrics.json").read_text())
    assert found["steps"] == 7 and found["test_loss"] == 0.4 and "test_accuracy" not in found
    assert found["test_metrics"] == {"loss": 0.4}
