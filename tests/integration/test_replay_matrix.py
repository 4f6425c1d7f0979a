"""Data parallelism equals one process on the union of the ranks' batches, whatever the user brings.

This file is also the script: one `paddle.distributed.launch` trains, through
`paddle_dist.fit()`, the same network once per row of the matrix below (optimizers with
parameter groups and their own rates, decay and clipping, schedulers, accumulation, both
API levels, every sync mode), and each rank writes every row's final weights. The test
then replays each row in this one process: the same optimizer, from the same initial
weights, stepping on the union of the ranks' batches of each step (Paddle's
DistributedBatchSampler, as documented), and asserts that every rank holds the same bits
and that they equal the replay within 1e-6.

The network (`Branchy`) holds what real models hold:
- `b`, a head that only the rows flagged in x[:, 0] reach: only rank 0's first batch and
  rank 1's second have flagged rows, so at each of those steps one rank has no gradient
  for `b` (a head for a class absent from the batch, a conditional branch);
- `never`, a layer no batch reaches: no rank ever has a gradient for it;
- `frozen`, a layer with stop_gradient=True;
- `a.weight`, used twice in one forward (tied weights).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

SAMPLES, FEATURES, CLASSES = 48, 8, 4
BATCH = 8                 # per rank on 2 ranks: 3 steps per epoch
EPOCHS = 2
TOLERANCE = 1e-6


# ----------------------------------------------------------------- what the user brings
def make_net(paddle):
    nn = paddle.nn

    class Branchy(nn.Layer):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(FEATURES, 16)
            self.frozen = nn.Linear(16, 16)
            self.a = nn.Linear(16, CLASSES)
            self.b = nn.Linear(16, CLASSES)
            self.never = nn.Linear(16, CLASSES)
            for p in self.frozen.parameters():
                p.stop_gradient = True

        def forward(self, x):
            h = paddle.tanh(self.trunk(x))
            h = h + paddle.tanh(self.frozen(h))
            out = self.a(h) + 0.5 * paddle.matmul(h, self.a.weight)      # tied: a.weight twice
            flagged = (x[:, 0] > 0.5).astype("float32").unsqueeze(1)
            if bool(flagged.sum() > 0):                 # only batches with flagged rows reach b
                out = out + self.b(h) * flagged
            return out

    paddle.seed(7)
    return Branchy()


def make_data(paddle):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    x[:, 0] = 0.0
    # Rank 0's first batch and rank 1's second (DistributedBatchSampler without shuffle:
    # rank r's k-th batch is samples [(k W + r) B, (k W + r + 1) B) on W ranks of batch B).
    x[0:4, 0] = 1.0
    x[3 * BATCH:3 * BATCH + 4, 0] = 1.0
    y = rng.randint(0, CLASSES, size=(SAMPLES,)).astype("int64")

    class Pairs(paddle.io.Dataset):
        def __init__(self):
            super().__init__()
            self.x, self.y = x, y

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return len(self.x)

    return Pairs()


def make_optimizer(paddle, name, net):
    """The optimizer of a row, as a user writes it."""
    opt, lr, clip = paddle.optimizer, paddle.optimizer.lr, paddle.nn
    head, rest = list(net.b.parameters()), [p for n, p in net.named_parameters() if not n.startswith("b.")]
    groups = [{"params": rest, "learning_rate": 2.0}, {"params": head}]
    if name == "sgd_groups_globalnorm":
        return opt.SGD(0.05, parameters=groups, grad_clip=clip.ClipGradByGlobalNorm(1.0))
    if name == "momentum_nesterov_groups":
        groups = [{"params": rest, "weight_decay": 0.01}, {"params": head, "learning_rate": 0.5}]
        return opt.Momentum(0.05, momentum=0.9, use_nesterov=True, parameters=groups,
                            grad_clip=clip.ClipGradByNorm(0.5))
    if name == "adam_group_clip":            # a clip of the group's own, none on the optimizer
        groups = [{"params": rest}, {"params": head, "grad_clip": clip.ClipGradByValue(0.02)}]
        return opt.Adam(0.01, parameters=groups)
    if name == "adamw_decay_fun":
        return opt.AdamW(0.01, parameters=net.parameters(), weight_decay=0.1,
                         apply_decay_param_fun=lambda param_name: param_name.endswith("w_0"))
    if name == "lamb":
        return opt.Lamb(0.01, lamb_weight_decay=0.01, parameters=net.parameters())
    if name == "rmsprop":
        return opt.RMSProp(0.01, momentum=0.5, centered=True, parameters=net.parameters())
    if name == "adagrad":
        return opt.Adagrad(0.1, parameters=net.parameters())
    if name == "adam_multi_precision":
        return opt.Adam(0.01, parameters=net.parameters(), multi_precision=True)
    if name == "sgd_step_scheduler":         # stepped after every optimizer step
        return opt.SGD(lr.ExponentialDecay(0.2, gamma=0.8), parameters=net.parameters())
    if name == "momentum_epoch_scheduler":   # stepped after every epoch (train.scheduler_every)
        return opt.Momentum(lr.StepDecay(0.1, step_size=1, gamma=0.3), momentum=0.9,
                            parameters=groups)
    raise KeyError(name)


LOOP_HAPI = ("train.api=loop", "train.api=hapi")
MODES = {"fused": ["sync.mode=fused"], "overlap": ["sync.mode=overlap"],
         "overlap_backend": ["sync.mode=overlap", "sync.transport=backend"],
         "backend": ["sync.mode=fused", "sync.transport=backend"],
         "buckets": ["sync.mode=fused", "sync.transport=backend", "sync.bucket_mb=0.0001"],
         "dataparallel": ["sync.mode=dataparallel"]}
EPOCH_RULE = ["train.scheduler_every=epoch"]
# row -> (optimizer, config overrides)
ROWS = {}
for _opt in ("sgd_groups_globalnorm", "adam_group_clip", "adamw_decay_fun", "lamb", "rmsprop",
             "adagrad", "adam_multi_precision", "sgd_step_scheduler"):
    ROWS[f"{_opt}/loop"] = (_opt, [])
ROWS["momentum_epoch_scheduler/loop"] = ("momentum_epoch_scheduler", EPOCH_RULE)
ROWS["momentum_epoch_scheduler/hapi"] = ("momentum_epoch_scheduler", EPOCH_RULE + ["train.api=hapi"])
ROWS["sgd_step_scheduler/hapi"] = ("sgd_step_scheduler", ["train.api=hapi"])
ROWS["adamw_decay_fun/hapi"] = ("adamw_decay_fun", ["train.api=hapi"])
for _mode, _overrides in MODES.items():       # the hardest optimizer through every sync mode
    for _api in LOOP_HAPI:
        ROWS[f"momentum_nesterov_groups/{_api[10:]}/{_mode}"] = ("momentum_nesterov_groups",
                                                                 [_api, *_overrides])
for _mode in ("fused", "overlap", "dataparallel"):   # accumulation: 2 micro-batches of 4
    for _api in LOOP_HAPI:
        ROWS[f"sgd_groups_globalnorm/{_api[10:]}/{_mode}/accumulate2"] = (
            "sgd_groups_globalnorm", [_api, *MODES[_mode], f"train.batch_size={BATCH // 2}",
                                      "train.accumulate_steps=2"])
# 4 ranks, half the batch each: the same global batches.
FOUR_RANKS = ["sgd_groups_globalnorm/loop", "adam_group_clip/loop",
              "momentum_nesterov_groups/loop/overlap", "momentum_nesterov_groups/hapi/fused",
              "momentum_nesterov_groups/loop/dataparallel",
              "momentum_nesterov_groups/hapi/dataparallel", "momentum_epoch_scheduler/hapi"]
# What the compat stage (Paddle 2.6.2, 3.2.2) runs: parameter groups and unused parameters
# in every sync mode at both levels, and the scheduler rule.
COMPAT = [name for name in ROWS if name.startswith(("momentum_nesterov_groups/", "sgd_groups_globalnorm/loop",
                                                     "sgd_step_scheduler", "momentum_epoch_scheduler"))]


def batch_of(overrides, default: int) -> int:
    sizes = [int(o.split("=")[1]) for o in overrides if o.startswith("train.batch_size=")]
    return sizes[0] if sizes else default


def train_rows(out: Path, names, batch: int) -> None:
    import paddle

    import paddle_dist

    data = make_data(paddle)
    weights, rank = {}, 0
    for name in names:
        opt_name, overrides = ROWS[name]
        cfg = paddle_dist.load_config(overrides=[
            f"train.batch_size={batch}", f"train.epochs={EPOCHS}", "train.shuffle=false",
            "dist.hang_timeout=0",      # (no watchdog process per row: the launch is bounded)
            "checkpoint.every_epochs=0", "train.log_every=100", f"output.run_dir={out}/{name.replace('/', '-')}",
            *[o if not o.startswith("train.batch_size=") else f"train.batch_size={batch_of(overrides, 0) * batch // BATCH}"
              for o in overrides]])
        env = paddle_dist.setup(cfg)
        rank = env.global_rank
        net = make_net(paddle)
        if name == names[0]:
            weights.update({f"initial/{k}": v.numpy() for k, v in net.state_dict().items()})
        paddle_dist.fit(net, data, config=cfg, loss=paddle.nn.CrossEntropyLoss(),
                        optimizer=make_optimizer(paddle, opt_name, net))
        weights.update({f"{name}/{k}": v.numpy() for k, v in net.state_dict().items()})
    np.savez(out / f"rank{rank}.npz", **weights)


# ----------------------------------------------------------------- the replay
def replay(name: str, initial, world: int, batch: int):
    """One process: the row's optimizer on the union of the ranks' batches of each step."""
    import paddle

    opt_name, overrides = ROWS[name]
    k = int(next((o.split("=")[1] for o in overrides if o.startswith("train.accumulate_steps=")), 1))
    micro = batch_of(overrides, BATCH) * batch // BATCH
    data = make_data(paddle)
    net = make_net(paddle)
    net.set_state_dict({key: paddle.to_tensor(value) for key, value in initial.items()})
    opt = make_optimizer(paddle, opt_name, net)
    scheduler = opt._learning_rate if isinstance(opt._learning_rate, paddle.optimizer.lr.LRScheduler) else None
    per_epoch = "train.scheduler_every=epoch" in overrides
    samplers = [paddle.io.DistributedBatchSampler(data, micro, num_replicas=world, rank=r, shuffle=False)
                for r in range(world)]
    loss_fn = paddle.nn.CrossEntropyLoss()
    for _ in range(EPOCHS):
        ranks = [list(s) for s in samplers]
        for step in range(len(ranks[0]) // k):
            index = np.concatenate([np.asarray(b) for r in ranks for b in r[step * k:(step + 1) * k]])
            loss = loss_fn(net(paddle.to_tensor(data.x[index])), paddle.to_tensor(data.y[index]))
            loss.backward()
            opt.step()
            opt.clear_grad()
            if scheduler is not None and not per_epoch:
                scheduler.step()
        if scheduler is not None and per_epoch:
            scheduler.step()
    return {key: value.numpy() for key, value in net.state_dict().items()}


# ----------------------------------------------------------------- the tests
if __package__:
    from .procs import check, run

SCRIPT = str(Path(__file__).resolve())


def _launch(out: Path, world: int, names, batch: int):
    check(run(["-m", "paddle.distributed.launch", "--nproc_per_node", str(world), "--log_dir",
               str(out / "log"), SCRIPT, "--out", str(out), "--rows", ",".join(names),
               "--batch", str(batch)], timeout=600))
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(world)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, request):
    names = COMPAT if request.config.option.markexpr == "compat" else list(ROWS)
    return names, _launch(tmp_path_factory.mktemp("matrix2"), 2, names, BATCH)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return FOUR_RANKS, _launch(tmp_path_factory.mktemp("matrix4"), 4, FOUR_RANKS, BATCH // 2)


def row(weights, name):
    """The state of one row ("a/loop" is not "a/loop/fused/accumulate2": keys hold no "/")."""
    found = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(name + "/")}
    return {k: v for k, v in found.items() if "/" not in k}


def max_diff(a, b) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.abs(a[k].astype("float64") - b[k].astype("float64")).max()) for k in a)


def check_rows(names, ranks, world: int, batch: int) -> dict:
    """Every rank bit-identical, equal to the replay within TOLERANCE; `b` trained, `never`
    untouched. Returns {row: largest difference from the replay}."""
    initial = row(ranks[0], "initial")
    diffs, failed = {}, []
    for name in names:
        mine = row(ranks[0], name)
        for r, other in enumerate(ranks[1:], 1):
            assert max_diff(mine, row(other, name)) == 0.0, f"{name}: rank {r} differs from rank 0"
        diffs[name] = max_diff(mine, replay(name, initial, world, batch))
        if diffs[name] > TOLERANCE:
            failed.append(f"{name}: {diffs[name]:.2e}")
        assert float(np.abs(mine["b.weight"] - initial["b.weight"]).max()) > 1e-4, name
        assert np.array_equal(mine["never.weight"], initial["never.weight"]), name
        assert np.array_equal(mine["frozen.weight"], initial["frozen.weight"]), name
    print(json.dumps({"world": world, "largest difference from the replay": diffs}, indent=1))
    assert not failed, f"differ from the one-process replay by more than {TOLERANCE}: {failed}"
    return diffs


@pytest.mark.compat
def test_two_ranks_equal_the_one_process_replay_for_every_row(two_ranks):
    names, ranks = two_ranks
    check_rows(names, ranks, 2, BATCH)


def test_four_ranks_equal_the_one_process_replay(four_ranks):
    names, ranks = four_ranks
    check_rows(names, ranks, 4, BATCH // 2)


@pytest.mark.compat
def test_ranks_whose_models_differ_are_stopped_before_anything_starts(tmp_path):
    script = Path(SCRIPT).parent / "scripts" / "models_differ.py"
    result = run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"),
                  str(script)], timeout=120, cwd=tmp_path)
    # The script does not catch fit()'s ConfigError: every rank ends with its one line and
    # exit 2 (errors.for_scripts), and the launcher's report is that line.
    assert result.returncode == 2, result.stderr
    line = ("paddle_dist: error: the ranks' models differ: parameter '0.weight' is "
            "[4, 8] float32 on rank 0 but [4, 9] float32 on rank 1")
    [said] = result.stderr.splitlines()
    assert said.startswith(line), result.stderr
    for rank in (0, 1):
        log = (tmp_path / "log" / f"workerlog.{rank}").read_text().strip()
        assert log.splitlines()[-1].startswith(line) and "Traceback" not in log, log
    assert not (tmp_path / "runs").exists()            # before the run directory


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args()
    train_rows(Path(args.out), args.rows.split(","), args.batch)
