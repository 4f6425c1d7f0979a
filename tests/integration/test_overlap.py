"""Overlapped gradient sync when a peer dies in the middle of backward().

This file is also the script: `python -m paddle_dist.launch --nprocs 2 THIS --out D
--transport T` trains with sync.mode=overlap, and rank 0, from a hook inside its own
backward() of step 3, SIGKILLs rank 1. Rank 0 is then inside backward() with buckets in
flight on its communication thread: it must end with a Python PeerFailure (recorded in
its status file), never be aborted from C++.
"""

import argparse
import itertools
import json
import os
import signal
import sys
from pathlib import Path

import pytest


KILL_AT = 3          # rank 0's 3rd backward()


def main(out: Path, transport: str) -> None:
    import paddle
    import paddle.distributed as dist

    import paddle_dist
    from paddle_dist.data.datasets import mnist_dataset

    cfg = paddle_dist.load_config(overrides=[
        "sync.mode=overlap", f"sync.transport={transport}", "train.batch_size=32", "train.epochs=1",
        "checkpoint.every_epochs=0", "train.log_every=1000", f"output.run_dir={out}"])
    env = paddle_dist.setup(cfg)
    pids: list = []
    dist.all_gather_object(pids, os.getpid())
    paddle.seed(1)
    net = paddle.nn.Sequential(paddle.nn.Linear(784, 256), paddle.nn.ReLU(), paddle.nn.Linear(256, 256),
                               paddle.nn.ReLU(), paddle.nn.Linear(256, 10))
    if env.global_rank == 0:
        calls = itertools.count(1)

        def kill_peer():          # the last layer's gradient is among backward()'s first
            if next(calls) == KILL_AT:
                os.kill(pids[1], signal.SIGKILL)
                (out / "killed_in_backward").write_text(json.dumps({"pid": pids[1]}))
        net[-1].weight._register_backward_hook(kill_peer)
    train_data = mnist_dataset("", "train", flatten=True)
    paddle_dist.fit(net, train_data, config=cfg,
                    optimizer=lambda ps: paddle.optimizer.SGD(0.05, parameters=ps))


if __package__:
    from .procs import run


@pytest.mark.compat
@pytest.mark.parametrize("transport", ["backend", "shm"])
def test_a_peer_killed_mid_backward_is_a_peer_failure(transport, tmp_path):
    result = run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"),
                  str(Path(__file__).resolve()), "--out", str(tmp_path), "--transport", transport],
                 timeout=180)
    assert (tmp_path / "killed_in_backward").exists(), result.stderr[-3000:]
    assert result.returncode != 0
    # The survivor recorded a Python PeerFailure for step 3 (it had done 2): it was neither
    # aborted from C++ nor left waiting.
    from ..oracles import rank_status       # here: this file also runs as the ranks' script

    survivor = rank_status(tmp_path, 0)
    assert survivor["state"] == "stopped", survivor
    assert survivor["error_type"] == "PeerFailure", survivor
    assert survivor["error"].startswith("gradient all-reduce failed"), survivor
    assert survivor["step"] == KILL_AT - 1
    log = (tmp_path / "log" / "workerlog.0").read_text()
    assert "PeerFailure: gradient all-reduce failed" in log
    assert "SIGABRT" not in log and "terminate called" not in log


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--transport", required=True)
    args = parser.parse_args()
    main(Path(args.out), args.transport)
