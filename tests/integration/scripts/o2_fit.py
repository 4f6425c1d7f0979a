"""fit() of a small CNN with BatchNorm under train.amp=O2 on a CPU: tests/gpu_standin.py
gives the model and optimizer the state `paddle.amp.decorate` gives them on a GPU
(bfloat16 weights but BatchNorm's, float32 master weights, float32 state_dict copies).

    python -m paddle_dist.launch --nprocs 2 -o train.amp=O2 -o train.amp_dtype=bfloat16 ... o2_fit.py OUT

The optimizer is SGD: the only one with a bfloat16 CPU kernel. Rank r writes
OUT/rank<r>.npz: its model's own tensors (state_dict(use_hook=False), widened to float32)
and its optimizer's master weights ("master:<name>"); OUT/rank<r>.json: their dtypes,
what state_dict() hands out, and what fit() returned.

    ... o2_fit.py OUT --overflow-at N     (with train.amp=O1, train.amp_dtype=float16)

makes rank 1's N-th training forward overflow (its outputs inf, as float16 overflows on a
GPU), once per OUT (OUT/overflowed marks it done, so a continued run does not overflow
again): the loss scaler must skip that step on every rank and halve its scale.

    ... o2_fit.py OUT --counted

trains on a loss with a count: every fourth sample's label is -1 (ignored), and the loss
returns {"loss": mean over the labelled samples, "count": their number}, so that a step's
loss is the mean over every labelled sample of all its micro-batches.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))     # the repository: tests.gpu_standin

import paddle  # noqa: E402

from tests import gpu_standin  # noqa: E402

SAMPLES, EVAL_SAMPLES = 256, 90
IGNORED = -1


def counted_loss(logits, labels):
    """The mean over the labelled samples, with their number: a loss with a count."""
    nll = paddle.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORED, reduction="none")
    count = (labels != IGNORED).astype("float32").sum()
    return {"loss": nll.sum() / count, "count": count}


class Quadrants(paddle.io.Dataset):
    """8x8 images with a bright square in one of 4 quadrants; the label is the quadrant."""

    def __init__(self, count, seed, unlabelled: bool = False):
        rng = np.random.RandomState(seed)
        self.x = rng.normal(0, 1.0, (count, 1, 8, 8)).astype("float32")
        self.y = rng.randint(0, 4, size=(count, 1)).astype("int64")
        for i, label in enumerate(self.y[:, 0]):
            top, left = (label // 2) * 4, (label % 2) * 4
            self.x[i, :, top:top + 4, left:left + 4] += 1.0
        if unlabelled:
            self.y[::4] = IGNORED

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


def build():
    paddle.seed(7)
    return gpu_standin.SmallBN()


def overflow_at(net, step: int, done: Path) -> None:
    """Rank 1's `step`-th training forward (counted from 1) returns inf, unless `done` exists."""
    seen = []

    def hook(layer, inputs, outputs):
        if layer.training and paddle.is_grad_enabled() and not done.exists():
            seen.append(1)
            if len(seen) == step:
                done.write_text(str(step))
                return outputs * float("inf")
        return outputs

    if paddle.distributed.get_rank() == 1:
        net.register_forward_post_hook(hook)


def main(out: Path, overflow: int = 0, counted: bool = False):
    gpu_standin.install()
    import paddle_dist

    net, made = build(), []
    if overflow:
        overflow_at(net, overflow, out / "overflowed")

    def sgd(parameters):
        made.append(paddle.optimizer.SGD(0.05, parameters=parameters))
        return made[-1]

    extra = dict(loss=counted_loss) if counted else dict(metrics=[paddle.metric.Accuracy()])
    result = paddle_dist.fit(net, Quadrants(SAMPLES, 0, counted), Quadrants(EVAL_SAMPLES, 1, counted),
                             optimizer=sgd, epochs=2, batch_size=8, **extra)
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
    main(Path(sys.argv[1]), int(sys.argv[3]) if sys.argv[2:3] == ["--overflow-at"] else 0,
         counted=sys.argv[2:3] == ["--counted"])
