"""Train a paddle_dist job: `python train.py [-c configs/x.yaml] [-o key=value ...]`.

Runs in one process, as a rank under `python -m paddle.distributed.launch ... train.py`,
or, with `-o dist.nprocs=2`, launches its own ranks.
"""

from paddle_dist.train import train_main
from paddle_dist.options import run

if __name__ == "__main__":
    run(train_main)
