"""Sparse embedding tables equal one process on the union of the ranks' batches, in every mode.

This file is also the script: one `paddle.distributed.launch` of 2 ranks trains, through
`paddle_dist.fit()`, a wide&deep CTR model (3 fields over a vocabulary of 10,000, each
field's table `nn.Embedding(v, 8, sparse=True)`, a wide table of width 1, an MLP, BCE) once
per row: sync modes auto, fused, overlap and dataparallel, at both API levels, with SGD and
Adam(lazy_mode=True), and the same model whose tables are a Layer of the user's own calling
`F.embedding(..., sparse=True)`. Each rank writes every row's final weights; the test
replays each row in this one process (the same optimizer on the union of the ranks'
batches of each step) and asserts that the ranks hold the same bits and equal the replay:
within 1e-6 with SGD, 1e-5 with Adam(lazy_mode=True). Paddle's default Adam (lazy_mode=False),
whose update on rows is not deterministic on CPU, must equal Adam on the dense gradient
within 5e-5: Adam divides each element by its own history, so an element whose gradients
stay near zero turns the dense layers' rounding (1e-8) into a larger step; the control row
with dense tables (`adam/dense/...`, no rows anywhere) differs from its replay as much
(2.7e-5, measured; 2.0e-5 with sparse tables). What issue 54 asks of default Adam is the
comparison with that control: the same job with `nn.Embedding(sparse=True)` tables ends
within 1e-5 of it in every mode (measured: the same bits, on Paddle 3.3.1 and 2.6.2).
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SAMPLES, FIELDS, VOCAB, DIM = 96, 3, 10_000, 8
BATCH = 8                 # per rank on 2 ranks: 6 steps per epoch
EPOCHS = 2
TOLERANCE = {"sgd": 1e-6, "adam_lazy": 1e-5, "adam": 5e-5}      # adam: module docstring


# ----------------------------------------------------------------- what the user brings
def make_net(paddle, own: bool):
    nn, F = paddle.nn, paddle.nn.functional

    class Table(nn.Layer):
        """A table of the user's own: F.embedding with sparse=True."""

        def __init__(self, rows, width):
            super().__init__()
            self.weight = self.create_parameter([rows, width], default_initializer=nn.initializer.Normal(0, 0.1))

        def forward(self, ids):
            return F.embedding(ids, self.weight, sparse=True)

    def table(width):
        if own == "dense":            # the control: dense tables
            return nn.Embedding(VOCAB, width)
        return Table(VOCAB, width) if own else nn.Embedding(VOCAB, width, sparse=True)

    class WideDeep(nn.Layer):
        def __init__(self):
            super().__init__()
            self.wide = table(1)
            self.deep = nn.LayerList([table(DIM) for _ in range(FIELDS)])
            self.mlp = nn.Sequential(nn.Linear(FIELDS * DIM, 16), nn.ReLU(), nn.Linear(16, 1))

        def forward(self, ids):
            wide = self.wide(ids).sum(axis=1)
            deep = paddle.concat([emb(ids[:, i]) for i, emb in enumerate(self.deep)], axis=1)
            return wide + self.mlp(deep)

    paddle.seed(11)
    return WideDeep()


def make_data(paddle):
    rng = np.random.RandomState(0)
    # Skewed ids, so that the ranks' batches share rows and repeat rows within a batch.
    ids = np.minimum(rng.zipf(1.3, size=(SAMPLES, FIELDS)) - 1, VOCAB - 1).astype("int64")
    y = ((ids.sum(axis=1) % 3) == 0).astype("float32")[:, None]

    class Clicks(paddle.io.Dataset):
        def __init__(self):
            super().__init__()
            self.x, self.y = ids, y

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return len(self.x)

    return Clicks()


def make_optimizer(paddle, name, net):
    if name == "sgd":
        return paddle.optimizer.SGD(0.5, parameters=net.parameters())
    if name == "adam_lazy":
        return paddle.optimizer.Adam(0.01, parameters=net.parameters(), lazy_mode=True)
    if name == "adam":
        return paddle.optimizer.Adam(0.01, parameters=net.parameters())
    raise KeyError(name)


MODES = {"auto": [], "fused": ["sync.mode=fused"], "overlap": ["sync.mode=overlap"],
         "overlap_backend": ["sync.mode=overlap", "sync.transport=backend"],
         "backend": ["sync.mode=fused", "sync.transport=backend"],
         "dataparallel": ["sync.mode=dataparallel"]}
# row -> (optimizer, own table?, config overrides)
ROWS = {}
for _opt in ("sgd", "adam_lazy"):
    for _table in ("embedding", "own"):
        for _mode, _overrides in MODES.items():
            ROWS[f"{_opt}/{_table}/loop/{_mode}"] = (_opt, _table == "own", _overrides)
        for _mode in ("auto", "overlap", "dataparallel"):
            ROWS[f"{_opt}/{_table}/hapi/{_mode}"] = (_opt, _table == "own", ["train.api=hapi", *MODES[_mode]])
for _mode in ("auto", "overlap", "dataparallel"):
    ROWS[f"adam/embedding/loop/{_mode}"] = ("adam", False, MODES[_mode])
ROWS["adam/own/hapi/auto"] = ("adam", True, ["train.api=hapi"])
ROWS["adam/dense/loop/auto"] = ("adam", "dense", [])
ROWS["sgd/embedding/loop/accumulate2"] = ("sgd", False, [f"train.batch_size={BATCH // 2}",
                                                          "train.accumulate_steps=2"])
# A loss that returns its count (weighting.py): the tables' rows divided by the step's count.
for _mode in ("auto", "overlap", "dataparallel"):
    ROWS[f"sgd/own/loop/{_mode}/counted"] = ("sgd", True, MODES[_mode])
ROWS["sgd/embedding/hapi/auto/counted"] = ("sgd", False, ["train.api=hapi"])


def counted_bce(paddle):
    """BCE as a sum over the batch's samples and their count (fit() divides by the step's count)."""
    def loss(logits, label):
        total = paddle.nn.functional.binary_cross_entropy_with_logits(logits, label, reduction="sum")
        return {"loss": total / label.shape[0], "count": paddle.to_tensor(float(label.shape[0]))}
    return loss


def train_rows(out: Path, names) -> None:
    import paddle

    import paddle_dist

    data = make_data(paddle)
    weights, rank = {}, 0
    for name in names:
        opt_name, own, overrides = ROWS[name]
        cfg = paddle_dist.load_config(overrides=[
            f"train.batch_size={BATCH}", f"train.epochs={EPOCHS}", "train.shuffle=false",
            "dist.hang_timeout=0", "checkpoint.every_epochs=0", "train.log_every=100",
            f"output.run_dir={out}/{name.replace('/', '-')}", *overrides])
        env = paddle_dist.setup(cfg)
        rank = env.global_rank
        net = make_net(paddle, own)
        weights.update({f"{name}/initial/{k}": v.numpy() for k, v in net.state_dict().items()})
        loss = counted_bce(paddle) if name.endswith("/counted") else paddle.nn.BCEWithLogitsLoss()
        paddle_dist.fit(net, data, config=cfg, loss=loss, optimizer=make_optimizer(paddle, opt_name, net))
        weights.update({f"{name}/final/{k}": v.numpy() for k, v in net.state_dict().items()})
    np.savez(out / f"rank{rank}.npz", **weights)


RESUME_EPOCHS = 12        # 72 steps, a checkpoint every 6


def resume_job(out: Path) -> None:
    """One run of the CTR model in the default mode with Adam(lazy_mode=True) and its own
    tables too, checkpointed every 6 steps; each rank writes its final weights."""
    import paddle

    import paddle_dist

    cfg = paddle_dist.load_config(overrides=[
        f"train.batch_size={BATCH}", f"train.epochs={RESUME_EPOCHS}", "checkpoint.every_steps=6",
        "train.log_every=1", f"output.run_dir={out}/run"])
    net = make_net(paddle, False)
    net.add_sublayer("own", make_net(paddle, True).wide)      # a table of its own as well
    paddle_dist.fit(net, make_data(paddle), config=cfg, loss=paddle.nn.BCEWithLogitsLoss(),
                    optimizer=make_optimizer(paddle, "adam_lazy", net))
    np.savez(out / f"rank{paddle.distributed.get_rank()}.npz", **{k: v.numpy() for k, v in net.state_dict().items()})


# ----------------------------------------------------------------- the replay
def replay(name: str, initial, world: int):
    """One process: the row's optimizer on the union of the ranks' batches of each step
    (Paddle's default Adam on the dense gradient: its update on rows is not deterministic)."""
    import paddle

    opt_name, own, overrides = ROWS[name]
    data = make_data(paddle)
    net = make_net(paddle, own)
    net.set_state_dict({key: paddle.to_tensor(value) for key, value in initial.items()})
    opt = make_optimizer(paddle, opt_name, net)
    samplers = [paddle.io.DistributedBatchSampler(data, BATCH, num_replicas=world, rank=r, shuffle=False)
                for r in range(world)]
    loss_fn = paddle.nn.BCEWithLogitsLoss()
    for _ in range(EPOCHS):
        for batches in zip(*[list(s) for s in samplers]):
            index = np.concatenate([np.asarray(b) for b in batches])
            loss = loss_fn(net(paddle.to_tensor(data.x[index])), paddle.to_tensor(data.y[index]))
            loss.backward()
            if opt_name == "adam":
                densify(paddle, net)
            opt.step()
            opt.clear_grad()
    return {key: value.numpy() for key, value in net.state_dict().items()}


def densify(paddle, net) -> None:
    """Every rows gradient as the dense gradient it stands for."""
    from paddle.base import core

    kind = getattr(core.VarDesc.VarType, "DENSE_TENSOR", None) or core.VarDesc.VarType.LOD_TENSOR
    for p in net.parameters():
        if p.grad is not None and p.grad.is_selected_rows():
            dense = np.zeros(p.shape, "float32")
            np.add.at(dense, np.asarray(p.grad.rows()), p.grad.numpy())
            p._set_grad_type(kind)
            p.grad = paddle.to_tensor(dense)


# ----------------------------------------------------------------- the tests
if __package__:
    from paddle_dist.runs.layout import Run

    from ..oracles import max_difference, rank_status
    from .procs import check, finish, run, start

SCRIPT = str(Path(__file__).resolve())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse2")
    check(run(["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
               str(out / "log"), SCRIPT, "--out", str(out)], timeout=900))
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(2)], out


def part(weights, name, which):
    prefix = f"{name}/{which}/"
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


@pytest.mark.compat
def test_sparse_tables_equal_the_one_process_replay_in_every_mode(two_ranks):
    ranks, _ = two_ranks
    diffs, failed = {}, []
    for name in ROWS:
        mine = part(ranks[0], name, "final")
        assert max_difference(mine, part(ranks[1], name, "final")) == 0.0, f"{name}: rank 1 differs from rank 0"
        initial = part(ranks[0], name, "initial")
        assert max_difference(initial, mine) > 1e-3, f"{name}: nothing trained"
        diffs[name] = max_difference(mine, replay(name, initial, 2))
        if diffs[name] > TOLERANCE[ROWS[name][0]]:
            failed.append(f"{name}: {diffs[name]:.2e}")
    print(json.dumps({"largest difference from the replay": diffs}, indent=1))
    assert not failed, f"differ from the one-process replay: {failed}"


@pytest.mark.compat
def test_default_adam_on_sparse_tables_equals_adam_on_dense_tables(two_ranks):
    """Paddle's default Adam (lazy_mode=False): the job with nn.Embedding(sparse=True) tables
    ends where the same job with dense tables does (the same seed, data and initial weights)."""
    ranks, _ = two_ranks
    dense = part(ranks[0], "adam/dense/loop/auto", "final")
    sparse = [name for name, (opt, own, _) in ROWS.items() if opt == "adam" and own is False]
    assert sparse
    for name in sparse:
        assert max_difference(part(ranks[0], name, "initial"), part(ranks[0], "adam/dense/loop/auto", "initial")) == 0.0
        assert max_difference(part(ranks[0], name, "final"), dense) <= 1e-5, name


def test_a_table_whose_gradient_is_released_is_not_named_untrained(two_ranks):
    """Paddle's clear_grad releases a rows gradient: the first epoch's line for parameters
    no rank trained must not name the tables (trainer/untrained.py)."""
    _, out = two_ranks
    log = (out / "log" / "workerlog.0").read_text()
    assert log.count("outputs in") == len(ROWS) and "got no gradient" not in log


def _resume_command(out: Path):
    return ["-m", "paddle_dist.launch", "--nprocs", "2", SCRIPT, "--out", str(out), "--resume-job"]


def test_a_killed_run_continued_by_the_same_command_ends_bitwise(tmp_path):
    """SIGKILL rank 1 after the first checkpoint: rank 0 stops on a PeerFailure (no SIGABRT),
    and the same command continues the run to the uninterrupted run's bits."""
    clean = tmp_path / "clean"
    clean.mkdir()
    check(run(_resume_command(clean), timeout=300))
    killed = tmp_path / "killed"
    killed.mkdir()
    proc, killer = start(_resume_command(killed), limit=300)
    latest = killed / "run" / "checkpoints" / "latest"
    while proc.poll() is None and not latest.exists():
        time.sleep(0.01)    # polling for a file: the job's own progress is the event
    os.kill(rank_status(killed / "run", 1)["pid"], signal.SIGKILL)
    out, err = finish(proc, killer)
    assert proc.returncode != 0 and "Root cause: rank 1 killed by SIGKILL" in err, err[-3000:]
    assert rank_status(killed / "run", 0)["state"] == "stopped" and "SIGABRT" not in out + err
    resumed = check(run(_resume_command(killed), timeout=300))
    assert "resuming from" in Run(killed / "run").rank_log(0).read_text(), resumed.stdout[-2000:]
    for r in range(2):
        final, reference = np.load(killed / f"rank{r}.npz"), np.load(clean / f"rank{r}.npz")
        assert all(np.array_equal(final[k], reference[k]) for k in reference.files), f"rank {r} differs"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--resume-job", action="store_true")
    args = parser.parse_args()
    if args.resume_job:
        resume_job(Path(args.out))
    else:
        train_rows(Path(args.out), args.rows.split(","))
