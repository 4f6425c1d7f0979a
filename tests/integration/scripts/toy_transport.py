"""A transport of one's own, added the way sync/transports.py says (a reducer and a
`register` call), and trained with through GradSync on the ranks of a real job: the
self-test's small MLP, 3 SGD steps against a one-process replay (doctor/checks.py).

    python -m paddle_dist.launch --nprocs 2 toy_transport.py OUT

Rank r writes OUT/rank<r>.json: how gradients travelled, the toy's all-reduce calls, the
largest difference from the replay and the weights' digest.
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))     # the repository

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from paddle_dist import checkpoint, config  # noqa: E402
from paddle_dist.doctor import checks  # noqa: E402
from paddle_dist.runtime import process  # noqa: E402
from paddle_dist.sync import transports  # noqa: E402


class ToyReducer:
    """Each array all-reduced on its own through the process group: slow, but a transport."""

    transport = None          # set to its registry entry below
    calls = 0

    def all_reduce(self, arrays, scale=1.0):
        for a in arrays:
            tensor = paddle.to_tensor(a * np.float32(scale))
            dist.all_reduce(tensor)
            a[:] = tensor.numpy()
            ToyReducer.calls += 1
        return len(arrays)


ToyReducer.transport = transports.register(transports.Transport(
    "toy", auto_mode="overlap", fused=True, compresses=False, opener=lambda env, count, phase: ToyReducer(),
    about="each array on its own"))


def main(out: Path) -> None:
    cfg = config.load(None, ["sync.transport=toy"])
    env = process.setup(cfg)
    with tempfile.TemporaryDirectory() as scratch:
        net, ref, how, _, _ = checks.train_against_replay(checks.Job(cfg, env, Path(scratch)), "fused")
    (out / f"rank{env.global_rank}.json").write_text(json.dumps({
        "how": how, "calls": ToyReducer.calls, "difference": checks._max_difference(net, ref),
        "digest": checkpoint.weights_digest(net)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
