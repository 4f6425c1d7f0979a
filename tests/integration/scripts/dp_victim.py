"""A plain DataParallel script (no paddle_dist import) that can kill itself or one of its
DataLoader workers at a given step, for the launcher's failure reports.

    python -m paddle_dist.launch --nprocs 2 dp_victim.py --kill-rank 1 --kill-step 3
    ... --workers 2 --kill worker      # SIGKILL one DataLoader worker of that rank instead

Every rank writes <out>/ready.<rank> once it has taken a step (when --out is given): its
pid and its DataLoader workers' pids, as JSON. `--on-usr1 75` makes SIGUSR1 end the
rank with exit code 75 after the step every rank is at, as a script that saves a
checkpoint on preemption would (the ranks agree on it with an all-reduce of the flag).
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist


class Data(paddle.io.Dataset):
    def __init__(self, n=4096):
        rng = np.random.RandomState(0)
        self.x = rng.randn(n, 32).astype("float32")
        self.y = self.x.sum(axis=1, keepdims=True).astype("float32")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


def children(pid):
    """Direct children of `pid` (its DataLoader workers)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=3)
    parser.add_argument("--kill", choices=["self", "worker"], default="self")
    parser.add_argument("--out", default="")
    parser.add_argument("--on-usr1", type=int, default=None)
    opts = parser.parse_args()
    asked = []
    if opts.on_usr1 is not None:
        signal.signal(signal.SIGUSR1, lambda signum, frame: asked.append(signum))
    dist.init_parallel_env()
    rank = dist.get_rank()
    paddle.seed(1)
    net = paddle.DataParallel(paddle.nn.Sequential(paddle.nn.Linear(32, 64), paddle.nn.ReLU(),
                                                   paddle.nn.Linear(64, 1)))
    data = Data()
    sampler = paddle.io.DistributedBatchSampler(data, batch_size=16, shuffle=True)
    loader = paddle.io.DataLoader(data, batch_sampler=sampler, num_workers=opts.workers)
    opt = paddle.optimizer.SGD(0.01, parameters=net.parameters())
    step = 0
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = paddle.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            step += 1
            if opts.on_usr1 is not None:
                flag = paddle.to_tensor([len(asked)], dtype="int32")
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                if int(flag.item()):
                    sys.exit(opts.on_usr1)
            if step == 1 and opts.out:
                ready, part = Path(opts.out, f"ready.{rank}"), Path(opts.out, f"ready.{rank}.tmp")
                part.write_text(json.dumps({"pid": os.getpid(), "workers": children(os.getpid())}))
                part.rename(ready)
            if rank == opts.kill_rank and step == opts.kill_step:
                victim = children(os.getpid())[0] if opts.kill == "worker" else os.getpid()
                os.kill(victim, signal.SIGKILL)
            if step >= opts.steps:
                print(f"rank {rank}: {step} steps, loss {float(loss):.4f}", flush=True)
                return


if __name__ == "__main__":
    main()
