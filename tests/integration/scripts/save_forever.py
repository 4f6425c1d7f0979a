"""Save checkpoints in a loop until killed: the crash test SIGKILLs it in the middle of saves.

usage: save_forever.py ROOT [--die-before OWNER.NAME:K] [--saves N] [--paced]

Carries on after the newest checkpoint in ROOT, so every run continues the previous
(killed) one. Before saving step N it sets every weight to N, so a reader can tell
whether a checkpoint's files belong together. Each save is what checkpoint.save() does,
snapshot() then write(), with "saving N" printed between the two (so a kill right after
that line lands inside the write) and "saved N" after; lines are flushed at once.

--die-before checkpoint._save_npz:2 makes the third save of this run SIGKILL the process
itself just before its 2nd call of checkpoint._save_npz (OWNER: checkpoint, os, shutil):
a crash at an exact point of a write, which a kill from outside only hits by luck.

--paced makes it wait, after each line, for one line on stdin: the caller reads a line,
answers, and may then kill, so the process is never more than one line ahead of what
the caller has read, however slowly the caller is scheduled.

--saves N makes the process SIGKILL itself right after its N-th finished save, so the
caller knows exactly which step is the newest (a kill from outside may land one save late).
"""

import argparse
import itertools
import os
import shutil
import signal
import sys
from pathlib import Path

import paddle

from paddle_dist import checkpoint

SAVES_BEFORE_DYING = 2


def build():
    net = paddle.nn.Linear(256, 256)
    opt = paddle.optimizer.Adam(learning_rate=0.01, parameters=net.parameters())
    net(paddle.ones([4, 256])).mean().backward()   # one step: Adam's moments exist
    opt.step()
    opt.clear_grad()
    return net, opt


def die_before(spec: str) -> None:
    """Replace OWNER.NAME by a wrapper that SIGKILLs this process at its K-th call."""
    name, k = spec.rsplit(":", 1)
    owner_name, attr = name.split(".")
    # checkpoint: the module that writes (checkpoint.io), where its calls look names up.
    owner = {"checkpoint": checkpoint.io, "os": os, "shutil": shutil}[owner_name]
    real, calls = getattr(owner, attr), itertools.count(1)

    def wrapper(*args, **kwargs):
        if next(calls) == int(k):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(owner, attr, wrapper)


def say(line: str, paced: bool) -> None:
    print(line, flush=True)
    if paced and not sys.stdin.readline():   # the caller has gone
        sys.exit(1)


def main(root: Path, die_spec: str, saves: int, paced: bool) -> None:
    net, opt = build()
    found = checkpoint.latest(root)
    step = checkpoint.load(found).meta["global_step"] if found else 0
    for done in itertools.count():
        if saves and done == saves:
            os.kill(os.getpid(), signal.SIGKILL)
        if die_spec and done == SAVES_BEFORE_DYING:
            die_before(die_spec)
        step += 1
        for param in net.parameters():
            param.set_value(paddle.full(param.shape, float(step)))
        meta = {"global_step": step, "epoch": 0, "step_in_epoch": step, "world_size": 1,
                "model": "linear256"}
        snap = checkpoint.snapshot(net, opt, meta)
        say(f"saving {step}", paced)
        checkpoint.write(root, snap, keep_last=2)
        say(f"saved {step}", paced)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--die-before", default="")
    parser.add_argument("--saves", type=int, default=0)
    parser.add_argument("--paced", action="store_true")
    args = parser.parse_args()
    main(args.root, args.die_before, args.saves, args.paced)
