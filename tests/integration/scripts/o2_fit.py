"""fit() of a small CNN with BatchNorm under train.amp=O2 on a CPU: tests/o2_standin.py
gives the model and optimizer the state `paddle.amp.decorate` gives them on a GPU
(bfloat16 weights but BatchNorm's, float32 master weights, float32 state_dict copies).

    python -m paddle_dist.launch --nprocs 2 -o train.amp=O2 -o train.amp_dtype=bfloat16 ... o2_fit.py OUT

The optimizer is SGD: the only one with a bfloat16 CPU kernel. Rank r writes
OUT/rank<r>.npz: its model's own tensors (state_dict(use_hook=False), widened to float32)
and its optimizer's master weights ("master:<name>"); OUT/rank<r>.json: their dtypes,
what state_dict() hands out, and what fit() returned.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))     # the repository: tests.o2_standin

import paddle  # noqa: E402

from tests import o2_standin  # noqa: E402

SAMPLES, EVAL_SAMPLES = 256, 90


class Quadrants(paddle.io.Dataset):
    """8x8 images with a bright square in one of 4 quadrants; the label is the quadrant."""

    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.x = rng.normal(0, 1.0, (count, 1, 8, 8)).astype("float32")
        self.y = rng.randint(0, 4, size=(count, 1)).astype("int64")
        for i, label in enumerate(self.y[:, 0]):
            top, left = (label // 2) * 4, (label % 2) * 4
            self.x[i, :, top:top + 4, left:left + 4] += 1.0

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


def build():
    paddle.seed(7)
    return o2_standin.SmallBN()


def main(out: Path):
    o2_standin.install()
    import paddle_dist

    net, made = build(), []

    def sgd(parameters):
        made.append(paddle.optimizer.SGD(0.05, parameters=parameters))
        return made[-1]

    result = paddle_dist.fit(net, Quadrants(SAMPLES, 0), Quadrants(EVAL_SAMPLES, 1), optimizer=sgd,
                             metrics=[paddle.metric.Accuracy()], epochs=2, batch_size=8)
    rank = paddle.distributed.get_rank()
    own = net.state_dict(use_hook=False)
    master = made[0]._master_weights
    arrays = {k: v.astype("float32").numpy() for k, v in own.items()}
    arrays.update({f"master:{name}": v.numpy() for name, v in master.items()})
    np.savez(out / f"rank{rank}.npz", **arrays)
    (out / f"rank{rank}.json").write_text(json.dumps({
        "dtypes": {k: str(v.dtype).replace("paddle.", "") for k, v in own.items()},
        "state_dict_dtypes": {k: str(v.dtype).replace("paddle.", "") for k, v in net.state_dict().items()},
        "steps": result.steps, "metrics": result.metrics, "history": result.history,
        "resumed_from": result.resumed_from, "multi_precision": made[0]._multi_precision,
        "master_dtypes": sorted({str(v.dtype).replace("paddle.", "") for v in master.values()})}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
