"""A job whose rank 1 joins only when told to: the window in which an outsider who found
rank 0's store can write into it before the ranks attest (paddle_dist.setup).

    python -m paddle_dist.launch --nprocs 2 held_rank.py --dir DIR

Rank 0 writes where Paddle's store listens to DIR/store, then joins. Rank 1 waits for the
file DIR/go (at most 120 s), then joins. Each rank that gets through setup() all-reduces
its rank and writes the sum to DIR/rank<N>.
"""

import argparse
import os
import time
from pathlib import Path

import paddle
import paddle.distributed as dist

import paddle_dist

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
out = Path(parser.parse_args().dir)
rank = int(os.environ["PADDLE_TRAINER_ID"])
if rank == 0:
    (out / "store.tmp").write_text(os.environ["PADDLE_MASTER"])
    (out / "store.tmp").rename(out / "store")
else:
    deadline = time.monotonic() + 120
    while not (out / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
paddle_dist.setup(paddle_dist.load_config())
total = paddle.to_tensor([float(rank)])
dist.all_reduce(total)
(out / f"rank{rank}").write_text(str(float(total.numpy()[0])))
