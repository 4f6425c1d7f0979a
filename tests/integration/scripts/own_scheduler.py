"""A user's own script whose optimizer brings its own LRScheduler, through paddle_dist.fit().

    python own_scheduler.py --out DIR --root RUNS --api loop|hapi

In one process it runs four fits (3 epochs each, 2 ranks: 4 optimizer steps an epoch):
  step         ExponentialDecay(0.1, gamma=0.9), train.scheduler_every=step and
               train.accumulate_steps=2 (2 micro-batches of 4 per optimizer step);
  epoch        MultiStepDecay(0.1, milestones=[1, 2], gamma=0.5), train.scheduler_every=epoch;
  step_resume  `step` again from its checkpoint of step 6 (mid-epoch), fresh weights and optimizer;
  epoch_resume `epoch` again from its checkpoint of step 8 (taken at the second epoch's end).
Each fit writes that one checkpoint only: the background writer keeps only the newest of
the snapshots waiting for it, so one of several in quick succession may never be written.
Each rank writes <out>/<api>-rank<N>.json: per fit, `optimizer.get_lr()` as each training
forward (a micro-batch) saw it, read by a forward pre-hook, and Result.losses.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import paddle

import paddle_dist

SAMPLES = 64          # 32 a rank: 8 micro-batches of 4 an epoch


class TinyNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.hidden = paddle.nn.Linear(6, 8)
        self.head = paddle.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(paddle.nn.functional.relu(self.hidden(x)))


class Points(paddle.io.Dataset):
    def __init__(self):
        rng = np.random.RandomState(0)
        self.x = rng.randn(SAMPLES, 6).astype("float32")
        self.y = rng.randint(0, 3, size=(SAMPLES, 1)).astype("int64")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return SAMPLES


FITS = {   # name: (scheduler, overrides)
    "step": (lambda: paddle.optimizer.lr.ExponentialDecay(0.1, gamma=0.9),
             ["train.scheduler_every=step", "train.accumulate_steps=2", "train.batch_size=4",
              "checkpoint.every_steps=6", "checkpoint.every_epochs=0"]),
    "epoch": (lambda: paddle.optimizer.lr.MultiStepDecay(0.1, milestones=[1, 2], gamma=0.5),
              ["train.scheduler_every=epoch", "train.batch_size=8", "checkpoint.every_epochs=2"]),
}
RESUMES = {"step_resume": ("step", 6), "epoch_resume": ("epoch", 8)}   # name: (fit, step)


def fit(api: str, root: str, name: str, resume: str = "none"):
    scheduler, overrides = FITS[name]
    cfg = paddle_dist.load_config(overrides=overrides + [
        f"train.api={api}", "train.epochs=3", f"output.root={root}", f"checkpoint.resume={resume}"])
    paddle_dist.setup(cfg)
    net = TinyNet()
    optimizer = paddle.optimizer.SGD(learning_rate=scheduler(), parameters=net.parameters())
    lrs = []
    net.register_forward_pre_hook(
        lambda layer, inputs: lrs.append(optimizer.get_lr()) if layer.training else None)
    result = paddle_dist.fit(net, Points(), optimizer=optimizer, config=cfg)
    return result, {"lrs": lrs, "losses": [float(v) for v in result.losses], "steps": result.steps}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--api", default="loop")
    opts = parser.parse_args()
    found, runs = {}, {}
    for name in FITS:
        result, found[name] = fit(opts.api, opts.root, name)
        runs[name] = Path(result.run_dir)
    for name, (source, step) in RESUMES.items():
        checkpoint = runs[source] / "checkpoints" / f"ckpt_{step:09d}"
        found[name] = fit(opts.api, opts.root, source, resume=str(checkpoint))[1]
    rank = paddle.distributed.get_rank()
    (Path(opts.out) / f"{opts.api}-rank{rank}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main()
