"""What fit() takes as data, and what it refuses before anything is on disk."""

import subprocess
import sys

import numpy as np
import paddle
import pytest

from paddle_dist.errors import DataError
from paddle_dist.trainer.loading import Source

# A script of one's own whose eval set is empty: a Dataset, or a DataLoader over one.
SCRIPT = """
import sys
import numpy as np, paddle, paddle_dist

class Points(paddle.io.Dataset):
    def __init__(self, n):
        self.x = np.arange(n * 4, dtype="float32").reshape(n, 4)
    def __getitem__(self, i):
        return self.x[i], self.x[i].sum(keepdims=True)
    def __len__(self):
        return len(self.x)

empty = Points(0) if sys.argv[1] == "dataset" else paddle.io.DataLoader(Points(0), batch_size=4)
cfg = paddle_dist.load_config(overrides=["output.root=runs", "train.epochs=1"])
paddle_dist.fit(paddle.nn.Linear(4, 1), Points(8), eval_data=empty, config=cfg, task="regression")
"""


class Nothing(paddle.io.Dataset):
    def __getitem__(self, i):
        raise IndexError(i)

    def __len__(self):
        return 0


@pytest.mark.parametrize("data", [Nothing(), paddle.io.DataLoader(Nothing(), batch_size=4)],
                         ids=["dataset", "loader"])
def test_an_eval_set_without_samples_is_refused_in_one_line(data):
    with pytest.raises(DataError) as refused:
        Source.of(data, "eval_data")
    assert str(refused.value) == (
        "fit(eval_data=...) has no samples (Nothing, len 0): its evaluation would report 0 on 0 "
        "samples and pick the best checkpoint from that; give it a dataset with samples, or leave "
        "eval_data out to train without evaluation")
    assert len(Source.of(paddle.io.TensorDataset([paddle.zeros([2, 1])]), "eval_data")) == 2


@pytest.mark.parametrize("given", ["dataset", "loader"])
def test_a_script_with_an_empty_eval_set_exits_2_before_its_run_directory(given, tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, given], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "paddle_dist: error: fit(eval_data=...) has no samples (Points, len 0)" in done.stderr, done.stderr
    assert "epoch 1/1" not in done.stdout + done.stderr      # refused before training
    assert not (tmp_path / "runs").exists()
