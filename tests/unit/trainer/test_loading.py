"""What fit() takes as data, and what it refuses before anything is on disk."""

import subprocess
import sys

import numpy as np
import paddle
import pytest

from paddle_dist.errors import ConfigError, DataError
from paddle_dist.trainer.loading import SampleLoader, Source

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


def test_a_dataloader_is_taken_apart_and_one_that_cannot_be_sharded_is_refused():
    data = paddle.io.TensorDataset([paddle.zeros([10, 3]), paddle.zeros([10, 1])])
    loader = paddle.io.DataLoader(data, batch_size=4, shuffle=True, drop_last=True, num_workers=2,
                                  collate_fn=lambda samples: samples)
    source = Source.of(loader, "train_data")
    assert (source.batch_size, source.shuffle, source.drop_last, source.num_workers) == (4, True, True, 2)
    assert source.dataset is data and source.collate_fn is loader.collate_fn

    class Mine(paddle.io.BatchSampler):
        pass

    own = Mine(data, batch_size=2)       # the user's batches, dealt out by the plan (grouping.py)
    assert Source.of(paddle.io.DataLoader(data, batch_sampler=own), "train_data").batch_sampler is own
    with pytest.raises(ConfigError, match="batch sampler .Mine."):
        Source.of(paddle.io.DataLoader(data, batch_sampler=own), "eval_data")

    class Endless(Mine):
        def __len__(self):
            raise TypeError("no length")

    with pytest.raises(ConfigError, match="Endless has no __len__"):
        Source.of(paddle.io.DataLoader(data, batch_sampler=Endless(data, batch_size=2)), "train_data")

    class Stream(paddle.io.IterableDataset):
        def __iter__(self):
            yield np.zeros(3)

    assert Source.of(Stream(), "train_data").stream         # read by streams.py's rule
    streamed = Source.of(paddle.io.DataLoader(Stream(), batch_size=3, num_workers=2), "train_data")
    assert (streamed.stream, streamed.batch_size, streamed.num_workers) == (True, 3, 2)
    assert Source.of(Stream(), "eval_data").stream           # evaluated by evalstream.py's rule
    evaluated = Source.of(paddle.io.DataLoader(Stream(), batch_size=4), "eval_data")
    assert (evaluated.stream, evaluated.batch_size) == (True, 4)
    with pytest.raises(ConfigError, match="not object"):
        Source.of(object(), "eval_data")
    subset = paddle.io.BatchSampler(sampler=paddle.io.SubsetRandomSampler([0, 1, 2]), batch_size=2)
    with pytest.raises(ConfigError, match="SubsetRandomSampler"):
        Source.of(paddle.io.DataLoader(data, batch_sampler=subset), "train_data")
    with pytest.raises(ConfigError, match="batch_size=None"):
        Source.of(paddle.io.DataLoader(data, batch_size=None), "train_data")
    shuffled = paddle.io.BatchSampler(sampler=paddle.io.RandomSampler(data), batch_size=2)
    assert Source.of(paddle.io.DataLoader(data, batch_sampler=shuffled), "train_data").shuffle
    kept = Source.of(paddle.io.DataLoader(data, batch_size=2, num_workers=1, persistent_workers=True), "x")
    assert "persistent_workers" not in kept.options      # rebuilt each epoch: no worker outlives it


def test_zero_workers_read_in_this_thread_and_a_failing_sample_says_which():
    class Bad(paddle.io.Dataset):
        def __getitem__(self, i):
            if i == 3:
                raise ValueError("broken file")
            return np.zeros(2, "float32"), np.int64(i)

        def __len__(self):
            return 6

    batches = SampleLoader(Bad(), [[0, 1], [2, 3]])
    first = next(iter(batches))
    assert isinstance(first[0], paddle.Tensor) and first[1].numpy().tolist() == [0, 1]
    with pytest.raises(DataError) as raised:
        list(batches)
    assert str(raised.value).startswith("reading sample 3 of Bad failed: ValueError: broken file (test_loading.py:")
    assert isinstance(raised.value.__cause__, ValueError)
