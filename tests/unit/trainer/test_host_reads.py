"""The training loop reads nothing back from the device per step.

On a GPU every `float(tensor)`, `.numpy()`, `.item()` or `.tolist()` waits for the device
to finish all queued work. The loop trainer keeps its losses on the device and reads them
once per log point (`train.log_every`); this test counts the reads made while stepping.
"""

import json
import sys

import numpy as np
import paddle
import pytest

import paddle_dist
from paddle_dist.trainer import progress
from paddle_dist.runtime import process
from paddle_dist.trainer.progress import Progress, read_values
from paddle_dist.trainer import engine, ledger, session

STEPS, LOG_EVERY, BATCH = 100, 10, 4
READERS = ("numpy", "item", "tolist", "__float__")
# Reads made inside these count: the optimizer step and its per-step bookkeeping.
STEP_CODE = {engine.step.__code__, engine.Engine.step.__code__,
             session.Session.before_step.__code__, session.Session.after_step.__code__,
             Progress.step.__code__, ledger.LossLedger.record.__code__}


class Points(paddle.io.Dataset):
    """A tiny regression set held in memory."""

    def __init__(self, n: int):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 4)).astype("float32")
        self.y = (self.x @ np.ones((4, 1), "float32")).astype("float32")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)

    def batch(self, indices):
        return self.x[indices], self.y[indices]


def _in_step(frame) -> bool:
    while frame is not None:
        if frame.f_code in STEP_CODE:
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def reads(monkeypatch):
    """The host reads of paddle.Tensors made inside a training step, by method name (a
    read made by another, such as `__float__` calling `item`, counts once)."""
    seen, depth = [], [0]
    for name in READERS:
        original = getattr(paddle.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if depth[0] == 0 and _in_step(sys._getframe(1)):
                seen.append(_name)
            depth[0] += 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(paddle.Tensor, name, counted)
    return seen


def test_the_loop_reads_losses_once_per_log_point(reads, tmp_path, monkeypatch):
    monkeypatch.setattr(process, "_ENV", None)        # this process's env, detected afresh
    handlers = list(progress.get().handlers)
    monkeypatch.setattr(progress.get(), "handlers", handlers)   # fit() replaces them
    cfg = paddle_dist.load_config(overrides=[
        "train.api=loop", f"train.batch_size={BATCH}", "train.epochs=1",
        f"train.log_every={LOG_EVERY}", "checkpoint.every_epochs=0",
        f"output.run_dir={tmp_path / 'run'}"])
    paddle_dist.setup(cfg)
    result = paddle_dist.fit(paddle.nn.Linear(4, 1), Points(STEPS * BATCH), config=cfg,
                             task="regression")
    assert result.steps == STEPS
    assert len(reads) <= STEPS // LOG_EVERY + 2, f"{len(reads)} host reads in {STEPS} steps"
    assert len(result.losses) == STEPS and all(type(v) is float for v in result.losses)
    assert result.metrics["train_loss"] == pytest.approx(np.mean(result.losses), rel=1e-6)


def test_read_values_reads_every_tensor_in_one_go(monkeypatch):
    calls = []
    numpy = paddle.Tensor.numpy
    monkeypatch.setattr(paddle.Tensor, "numpy", lambda self: calls.append(1) or numpy(self))
    values = [paddle.to_tensor(0.5), 2, np.float32(0.25), paddle.to_tensor([1.5], dtype="float64")]
    assert read_values(values) == [0.5, 2.0, 0.25, 1.5]
    assert len(calls) == 1


def test_a_users_model_names_its_run_and_its_metrics_are_plain_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "_ENV", None)
    monkeypatch.setattr(progress.get(), "handlers", list(progress.get().handlers))
    cfg = paddle_dist.load_config(overrides=["train.epochs=1", f"train.batch_size={BATCH}",
                                             "checkpoint.every_epochs=0", f"output.root={tmp_path}"])
    paddle_dist.setup(cfg)
    result = paddle_dist.fit(paddle.nn.Linear(4, 1), Points(STEPS * BATCH), Points(10), config=cfg,
                             task="regression")
    assert result.run_dir.name.startswith("linear-") and cfg.output.name == ""
    assert type(result.metrics["eval_count"]) is int and result.metrics["eval_count"] == 10
    assert all(type(v) is float for k, v in result.metrics.items() if k not in ("epoch", "eval_count"))
    assert json.loads((result.run_dir / "metrics.json").read_text())["test_samples"] == 10


def test_results_of_collectives_are_read_inside_the_collectives_phase(monkeypatch):
    """Over NCCL a collective returns at once and the host waits where it reads the result:
    that read must be inside the phase the hang watchdog sees, or every rank of a hung
    job looks 'silent outside a collective'. Checked for the metrics' all-reduce, the
    weights check's all-gather and the stop flag's all-reduce (sync.mode=dataparallel)."""
    import contextlib
    from types import SimpleNamespace

    import paddle.distributed as dist

    from paddle_dist.sync import grad_sync as grad_sync_module
    from paddle_dist.trainer import agreement, evaluation

    phases, reads = [], []

    @contextlib.contextmanager
    def phase(kind, name, nbytes):
        phases.append(name)
        yield
        phases.pop()

    def all_reduce(tensor, *args, **kwargs):
        return None

    def all_gather(out, tensor, *args, **kwargs):
        out.extend([tensor, tensor])

    numpy = paddle.Tensor.numpy
    monkeypatch.setattr(paddle.Tensor, "numpy", lambda self: reads.append(list(phases)) or numpy(self))
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    env = SimpleNamespace(is_distributed=True, global_rank=0, world_size=2, backend="nccl", device="gpu:0")
    evaluation.all_reduce_sum([1.0, 2.0], env, phase)
    agreement.check(paddle.nn.Linear(2, 2), env, 1, phase)
    grad_sync = grad_sync_module.GradSync(env, phase, mode="dataparallel")
    grad_sync.average()
    assert reads == [["all-reduce"], ["all-gather"], ["all-gather"], ["all-reduce"]], reads
