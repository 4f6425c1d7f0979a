"""A user's own model and datasets through `paddle_dist.fit`, at both API levels.

This file is also the training script the tests run: standalone, under
`python -m paddle.distributed.launch` and under Paddle's own `spawn`, unchanged. Each rank
writes its final weights and what it saw to <out>/rank<N>.npz / .json.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

TRAIN_SAMPLES = 640  # 20 steps per epoch at a global batch of 32
TRAIN_STEPS = 50     # into the third epoch: the per-epoch shuffles must agree too
BATCH = 16           # per rank with 2 ranks; the single process uses 2 * BATCH
EVAL_SAMPLES = 999   # odd on purpose: 2 ranks get 500 and 499, nothing may be padded


# ----------------------------------------------------------------- the user's script
def build_parts():
    import paddle

    from paddle_dist.data.datasets import load_mnist

    class Digits(paddle.io.Dataset):
        def __init__(self, split, limit=None):
            images, labels = load_mnist("", split)
            self.x = (images[:limit].reshape(-1, 784) / 255.0).astype("float32")
            self.y = labels[:limit].reshape(-1, 1).astype("int64")

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return len(self.x)

    class TinyNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.hidden = paddle.nn.Linear(784, 32)
            self.out = paddle.nn.Linear(32, 10)

        def forward(self, x):
            return self.out(paddle.nn.functional.relu(self.hidden(x)))

    return TinyNet, Digits("train", TRAIN_SAMPLES), Digits("test", EVAL_SAMPLES)


def train_rank(opts):
    import paddle

    import paddle_dist

    cfg = paddle_dist.load_config(overrides=[
        f"train.api={opts.api}", f"train.batch_size={opts.batch}", f"train.max_steps={TRAIN_STEPS}",
        "train.epochs=3", "train.log_every=5", "checkpoint.every_epochs=0",
        f"output.run_dir={opts.out}/run"])
    env = paddle_dist.setup(cfg)
    net_class, train_data, eval_data = build_parts()
    net = net_class()
    result = paddle_dist.fit(net, train_data, eval_data, config=cfg,
                             optimizer=lambda params: paddle.optimizer.SGD(0.1, parameters=params))
    out = Path(opts.out)
    np.savez(out / f"rank{env.global_rank}.npz", **{k: v.numpy() for k, v in net.state_dict().items()})
    (out / f"rank{env.global_rank}.json").write_text(json.dumps({
        "world_size": env.world_size, "launcher": env.launcher, "losses": result.losses,
        "metrics": result.metrics, "steps": result.steps}))


def script_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--api", default="loop")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--spawn", type=int, default=0)
    opts = parser.parse_args(argv)
    if opts.spawn:
        import paddle.distributed as dist

        dist.spawn(train_rank, args=(opts,), nprocs=opts.spawn)
    else:
        train_rank(opts)


# ----------------------------------------------------------------- the tests
if __package__:  # imported by pytest (as a script, only the part above is used)
    from .procs import check, run

SCRIPT = str(Path(__file__).resolve())


def _load(out: Path, rank: int):
    weights = dict(np.load(out / f"rank{rank}.npz"))
    return weights, json.loads((out / f"rank{rank}.json").read_text())


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process with batch 2B, per API level."""
    outs = {}
    for api in ("loop", "hapi"):
        out = tmp_path_factory.mktemp(f"single-{api}")
        check(run([SCRIPT, "--out", str(out), "--api", api, "--batch", str(2 * BATCH)]))
        outs[api] = _load(out, 0)
    return outs


@pytest.mark.parametrize("mode", ["launch", "spawn"])
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_two_ranks_equal_one_process_with_double_batch(api, mode, single, tmp_path):
    if mode == "launch":
        args = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                "--log_dir", str(tmp_path / "log"), SCRIPT, "--out", str(tmp_path), "--api", api]
    else:
        args = [SCRIPT, "--out", str(tmp_path), "--api", api, "--spawn", "2"]
    check(run(args))
    (w0, info0), (w1, info1) = _load(tmp_path, 0), _load(tmp_path, 1)
    assert info0["world_size"] == info1["world_size"] == 2
    assert info0["steps"] == info1["steps"] == TRAIN_STEPS
    assert _max_diff(w0, w1) == 0.0, "ranks ended with different weights"
    ref_weights, ref_info = single[api]
    assert _max_diff(w0, ref_weights) <= 1e-5
    # Exact evaluation: every one of the 999 samples counted once, same result on each rank,
    # and the same result as one process evaluating everything.
    assert info0["metrics"]["eval_count"] == info1["metrics"]["eval_count"] == EVAL_SAMPLES
    assert info0["metrics"] == info1["metrics"]
    assert info0["metrics"]["epoch"] == 3
    assert info0["metrics"]["eval_accuracy"] == ref_info["metrics"]["eval_accuracy"]
    assert abs(info0["metrics"]["eval_loss"] - ref_info["metrics"]["eval_loss"]) <= 1e-5


def test_hapi_and_loop_give_the_same_losses(single):
    loop_losses = single["loop"][1]["losses"]
    hapi_losses = single["hapi"][1]["losses"]
    assert len(loop_losses) == len(hapi_losses) == TRAIN_STEPS
    np.testing.assert_allclose(hapi_losses, loop_losses, rtol=0, atol=1e-6)
    assert _max_diff(single["loop"][0], single["hapi"][0]) <= 1e-6


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    script_main(sys.argv[1:])
