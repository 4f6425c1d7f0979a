"""Train through `paddle.distributed.spawn`: `python tools/spawn_train.py --nprocs 2 [--gpus 0,1] [-c cfg]`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddle_dist.train import spawn_main  # noqa: E402
from paddle_dist.options import run  # noqa: E402

if __name__ == "__main__":
    run(spawn_main)
