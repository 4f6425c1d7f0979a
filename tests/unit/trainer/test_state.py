"""The state that survives a resume owns itself (trainer/state.py, checkpoint.Meta): a
checkpoint's meta.json is read through its typed record only, the Session is built from
one record and nothing outside it assigns its attributes, and what a step produced is
returned, never left in an attribute for another module to read."""

import ast
from pathlib import Path

import numpy as np
import paddle

from paddle_dist.checkpoint import Meta
from paddle_dist.sync.batchstats import BatchStats
from paddle_dist.sync.grad_sync import GradSync
from paddle_dist.trainer.engine import step
from paddle_dist.trainer.feed import Feed
from paddle_dist.trainer.progress import Progress
from paddle_dist.runtime.env import DistEnv

PACKAGE = Path(__file__).resolve().parents[3] / "paddle_dist"
META_KEYS = {"global_step", "epoch", "step_in_epoch", "world_size", "model", "api", "config_hash",
             "history", "plan_world", "plan_accumulate", "epoch_loss", "ema_updates", "loss_scaler"}


def _modules(outside: str = ""):
    for path in sorted(PACKAGE.rglob("*.py")):
        if not outside or outside not in path.parts:
            yield path, ast.parse(path.read_text())


def _reads_meta_by_key(node) -> bool:
    """`x.meta["k"]`, `meta["k"]`, `meta.get("k")` with k a key of meta.json."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        target, key = node.value, node.slice.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and node.args and isinstance(node.args[0], ast.Constant):
        target, key = node.func.value, node.args[0].value
    else:
        return False
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return "meta" in name.lower() and key in META_KEYS


def test_no_meta_key_is_read_by_string_outside_checkpoint():
    found = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for path, tree in _modules("checkpoint")
             for node in ast.walk(tree) if _reads_meta_by_key(node)]
    assert found == []


def test_nothing_outside_the_session_assigns_its_attributes():
    found = []
    for path, tree in _modules():
        if path.name == "session.py":
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for item in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    owner = item.value if isinstance(item, ast.Attribute) else None
                    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                    if name == "session":
                        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []


def test_a_checkpoint_from_before_the_record_loads_with_its_defaults():
    old = {"global_step": 12, "epoch": 1, "step_in_epoch": 4, "world_size": 2, "model": "mlp",
           "history": [{"epoch": 1, "train_loss": 0.5}], "mine": "kept"}
    meta = Meta.of(old)
    assert (meta.planned_world, meta.plan_accumulate, meta.ema_updates, meta.loss_scaler) == (2, 0, None, None)
    assert meta.history == ({"epoch": 1, "train_loss": 0.5},) and meta.extra == {"mine": "kept"}
    again = Meta.of(meta.to_dict())
    assert again.planned_world == 2 and again.history == meta.history and again.extra == meta.extra


def test_a_record_round_trips_every_piece():
    meta = Meta(global_step=40, epoch=2, step_in_epoch=8, world_size=1, model="x", api="hapi",
                config_hash="ab", history=({"epoch": 1},), plan_world=2, plan_accumulate=1,
                epoch_loss=(1.5, 8.0, {"loss_box": 0.5}), ema_updates=40, loss_scaler={"scale": 1024.0})
    assert Meta.of(meta.to_dict()) == meta


def test_a_step_returns_what_it_produced_and_leaves_no_mailbox():
    paddle.seed(1)
    net = paddle.nn.Linear(3, 2)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    feed = Feed(net, inputs=1)

    def parted(out, label):
        return {"loss_a": ((out - label) ** 2).mean(), "loss_b": out.abs().mean()}

    batch = ([paddle.ones([4, 3])], [paddle.zeros([4, 2])])
    result = step(net, parted, [batch, batch], opt, feed=feed)
    assert sorted(result.parts) == ["loss_a", "loss_b"]
    assert np.isclose(float(result.loss), float(result.parts["loss_a"]) + float(result.parts["loss_b"]))
    assert not {"counts", "loss_parts", "step_parts", "eval_loss"} & set(vars(feed))
    env = DistEnv()
    sync, stats = GradSync(env), BatchStats(paddle.nn.BatchNorm1D(2), env)
    assert not hasattr(sync, "ridden") and not hasattr(stats, "sync")
    assert not any(hasattr(Progress, name) for name in ("losses", "epoch_losses", "epoch_parts"))
