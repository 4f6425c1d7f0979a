"""`python -m paddle_dist.checkpoint show | export` (paddle_dist/checkpoint/__main__.py)."""

import json
from pathlib import Path

import numpy as np
import paddle

from paddle_dist import checkpoint as ck
from paddle_dist import models
from paddle_dist.runs.layout import Run

from tests.integration.procs import run
from tests.unit.checkpoint.test_io import Wrapped, assert_bitwise, meta, new_model, sgd, weights
from tests.unit.checkpoint.test_io import one_step, saved  # noqa: F401  (fixtures)


def test_cli_show_and_export(saved, tmp_path):
    shown = run(["-m", "paddle_dist.checkpoint", "show", str(saved.parent)], timeout=180)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == meta(1)
    out = tmp_path / "exported.pdparams"
    exported = run(["-m", "paddle_dist.checkpoint", "export", str(saved), str(out)], timeout=180)
    assert exported.returncode == 0, exported.stderr
    loaded = paddle.load(str(out))
    np.testing.assert_array_equal(np.asarray(loaded["weight"]), ck.load(saved).model["weight"])
    fresh, _, _ = new_model(seed=1)
    ck.load_weights(fresh, out)
    assert_bitwise(weights(fresh), ck.load(saved).model)


def test_cli_bad_path_is_one_line_and_exit_2(tmp_path):
    result = run(["-m", "paddle_dist.checkpoint", "show", str(tmp_path / "nowhere")], timeout=180)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not found" in lines[0] and str(tmp_path / "nowhere") in lines[0]
    assert result.stdout == ""


def test_cli_export_of_a_wrapped_models_checkpoint_is_refused_in_one_line(tmp_path):
    # A fit() run of a built-in LeNet wrapped in a Layer of the user's: every name is 'net.'...
    outer = Wrapped(models.build("lenet", 10))
    checkpoint = ck.save(Run(tmp_path).checkpoints, outer, sgd(outer), dict(meta(1), model="lenet"))
    config = str(Path(__file__).resolve().parents[3] / "configs" / "mnist_lenet.yaml")
    result = run(["-m", "paddle_dist.export", str(checkpoint), "-c", config, "--out", str(tmp_path / "out")],
                 timeout=180)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"checkpoint {checkpoint} does not fit this model: missing in the checkpoint: " in lines[0]
    assert "and 6 more; not in the model: net." in lines[0] and "with 'net.' in front" in lines[0]
    assert result.stdout == "" and not (tmp_path / "out").exists()
