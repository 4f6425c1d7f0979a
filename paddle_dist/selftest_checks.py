"""The self-test's checks, each run by every rank of a real job (selftest_rank.py runs
them, selftest.py starts the job and prints the table). Each returns a Row: PASS, FAIL, or
SKIP with the reason it cannot run here.

They use paddle_dist's own code paths: `GradSync` built from the config as the trainer
builds it, `trainer.loop.step` (the trainer's optimizer step), `checkpoint.save()` /
`load()` / `restore()`, `amp.plan` / `amp.scaler`, `export` and `predict.Predictor`.

Example:
    row = grad_sync("overlap", Job(cfg, env, scratch))   # Row('grad sync overlap', 'PASS', ...)
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import paddle
import paddle.distributed as dist

from . import amp, checkpoint
from . import config as configlib
from . import env as envlib
from .comm import first_line
from .errors import DeviceError
from .export import export as export_model
from .predict import Predictor
from .sync import GradSync, wrap
from .trainer import loop

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
DTYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16")
COUNT = 1024              # values per all-reduce
TOLERANCE = 1e-5          # float32 weights against the one-process replay; inference against dygraph
AMP_TOLERANCE = 1e-2      # 16-bit matmuls: about 3 decimal digits
STEPS, BATCH, LR = 3, 8, 0.1
ONE_RANK = "one rank: nothing to exchange (run 2 or more: --nprocs 2, or --gpus 0,1)"


@dataclass
class Row:
    """One line of the table, as one rank saw it."""

    check: str
    status: str
    seconds: float = 0.0
    detail: str = ""
    digest: str = ""          # sha256 of the weights: the parent checks the ranks agree


@dataclass
class Job:
    cfg: configlib.Config
    env: envlib.DistEnv
    scratch: Path             # this rank's own files


# ---------------------------------------------------------------- all-reduce
def all_reduce(dtype: str, job: Job, reduce: Callable = dist.all_reduce) -> Row:
    """Every rank adds (rank + 1) times the same small integers: the sum is exact in every
    dtype. On gloo, a 16-bit dtype Paddle cannot all-reduce is SKIP with the reason."""
    name, env = f"all-reduce {dtype}", job.env
    if not env.is_distributed:
        return Row(name, SKIP, detail=ONE_RANK)
    base = np.arange(COUNT) % 9 - 4
    tensor = paddle.to_tensor((base * (env.global_rank + 1)).astype("float32")).astype(dtype)
    half = dtype in ("float16", "bfloat16") and env.backend == "gloo"
    try:
        reduce(tensor)
    except Exception as exc:  # noqa: BLE001 - an unsupported dtype is a finding, not a crash
        if half:
            return Row(name, SKIP, detail=f"Paddle's gloo has no {dtype} all-reduce: {first_line(exc)}")
        raise
    got = tensor.astype("float32").numpy().astype("float64")
    want = base * (env.world_size * (env.world_size + 1) // 2)
    if np.array_equal(got, want):
        return Row(name, PASS, detail=f"{COUNT} values summed exactly over {env.world_size} ranks")
    at = int(np.flatnonzero(got != want)[0])
    wrong = f"value {at}: got {got[at]:g}, expected {want[at]:g}"
    if half and dtype == "float16":       # config.check_compress refuses fp16 on gloo for this
        return Row(name, SKIP, detail=f"Paddle's gloo sums float16 wrongly ({wrong}); "
                                      "paddle_dist sends no float16 over gloo")
    return Row(name, FAIL, detail=wrong)


# ---------------------------------------------------------------- gradient sync
def _net() -> paddle.nn.Layer:
    return paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4))


def _twins(seed: int):
    """The network to train and its one-process replay, with the same initial weights."""
    paddle.seed(seed)
    net = _net()
    paddle.seed(seed)
    return net, _net()


def _global_batch(step: int, world: int, seed: int):
    rng = np.random.default_rng(seed + step)
    x = rng.standard_normal((BATCH * world, 16)).astype("float32")
    y = rng.integers(0, 4, BATCH * world).astype("int64")
    return x, y


def _tensors(x, y):
    """One batch as loop.step takes it: ([input], [label])."""
    return [paddle.to_tensor(x)], [paddle.to_tensor(y)]


def _max_difference(net, ref) -> float:
    return max(float(np.abs(a.numpy().astype("float64") - b.numpy().astype("float64")).max())
               for a, b in zip(net.parameters(), ref.parameters()))


def train_against_replay(job: Job, mode: str, precision=amp.AmpPlan()):
    """STEPS optimizer steps of a small MLP, data-parallel through GradSync(`mode`) and the
    trainer's own step, beside one process taking the same steps on the whole batch in
    float32. Returns (net, replay, the sync's description, its exchange's class name)."""
    env, seed = job.env, job.cfg.train.seed
    net, ref = _twins(seed)
    opt = paddle.optimizer.SGD(LR, parameters=net.parameters())
    ref_opt = paddle.optimizer.SGD(LR, parameters=ref.parameters())
    sync = GradSync.from_config(env, dataclasses.replace(job.cfg.sync, mode=mode, compress="none"))
    sync.attach(opt)
    scaler = amp.scaler(precision, sync)
    try:
        model, loss = wrap(net, env, sync), paddle.nn.CrossEntropyLoss()
        for step in range(STEPS):
            x, y = _global_batch(step, env.world_size, seed)
            mine = slice(env.global_rank * BATCH, (env.global_rank + 1) * BATCH)
            loop.step(model, loss, [_tensors(x[mine], y[mine])], opt, precision, scaler, sync.arm)
            loop.step(ref, loss, [_tensors(x, y)], ref_opt)
        exchange = type(sync.overlap.exchange).__name__ if sync.overlap is not None else "step"
        return net, ref, sync.describe(), exchange
    finally:
        sync.close()


def grad_sync(mode: str, job: Job) -> Row:
    """Ranks' weights after GradSync(`mode`) against the one-process replay (within
    TOLERANCE); the parent checks that the ranks' weights are bit-identical."""
    name = f"grad sync {mode}"
    if not job.env.is_distributed:
        return Row(name, SKIP, detail=ONE_RANK)
    net, ref, how, _ = train_against_replay(job, mode)
    diff = _max_difference(net, ref)
    return Row(name, PASS if diff <= TOLERANCE else FAIL, digest=checkpoint.weights_digest(net),
               detail=f"max |w - one-process replay| {diff:.1e} after {STEPS} steps; {how}")


def amp_step(dtype: str, job: Job) -> Row:
    """GPUs: O1 mixed precision (float16 with the synced GradScaler, or bfloat16) through
    sync.mode=overlap, which on GPUs all-reduces through NCCL asynchronously (AsyncExchange)."""
    name = f"AMP {dtype}" + (" + GradScaler" if dtype == "float16" else "")
    if not job.env.device.startswith("gpu"):
        return Row(name, SKIP, detail="GPUs only: Paddle runs mixed precision on CUDA/XPU devices")
    train = dataclasses.replace(job.cfg.train, amp="O1", amp_dtype=dtype)
    try:
        precision = amp.plan(train, job.env.device)
    except DeviceError as exc:
        return Row(name, SKIP, detail=str(exc).split(";")[0])
    net, ref, how, exchange = train_against_replay(job, "overlap", precision)
    diff = _max_difference(net, ref)
    ok = np.isfinite(diff) and diff <= AMP_TOLERANCE
    if job.env.is_distributed and exchange != "AsyncExchange":
        ok, how = False, f"{how}: expected NCCL's AsyncExchange, got {exchange}"
    return Row(name, PASS if ok else FAIL, digest=checkpoint.weights_digest(net),
               detail=f"max |w - float32 replay| {diff:.1e} after {STEPS} steps; {how} ({exchange})")


# ---------------------------------------------------------------- checkpoint
def _draws() -> List[float]:
    """A few numbers from each generator a checkpoint restores: Python, numpy, Paddle."""
    return [random.random(), *np.random.rand(2).tolist(), *paddle.rand([2]).numpy().tolist()]


def _arrays(state: Dict) -> Dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in state.items() if isinstance(v, paddle.Tensor)}


def checkpoint_round_trip(job: Job) -> Row:
    """Save (model, Adam state, RNG), train on and draw, load and restore: the weights,
    the optimizer's tensors and the next random numbers are those of the moment of the save."""
    paddle.seed(job.cfg.train.seed)
    net = _net()
    opt = paddle.optimizer.Adam(1e-3, parameters=net.parameters())
    x, y = _tensors(*_global_batch(0, 1, job.cfg.train.seed))
    loss = paddle.nn.CrossEntropyLoss()
    loop.step(net, loss, [(x, y)], opt)
    meta = {"global_step": 1, "epoch": 0, "step_in_epoch": 1, "world_size": job.env.world_size,
            "model": "selftest"}
    path = checkpoint.save(job.scratch / "checkpoints", net, opt, meta, keep_last=1)
    weights, moments, drawn = _arrays(net.state_dict()), _arrays(opt.state_dict()), _draws()
    loop.step(net, loss, [(x, y)], opt)        # everything moves on
    checkpoint.restore(checkpoint.load(path), net, opt, rng=True)
    wrong = [k for k, v in _arrays(net.state_dict()).items() if not np.array_equal(v, weights[k])]
    wrong += [k for k, v in _arrays(opt.state_dict()).items() if not np.array_equal(v, moments.get(k))]
    if wrong:
        return Row("checkpoint + RNG", FAIL, detail=f"not restored: {', '.join(wrong[:3])}")
    again = _draws()
    if again != drawn:
        return Row("checkpoint + RNG", FAIL, detail=f"random numbers differ: {drawn} then {again}")
    return Row("checkpoint + RNG", PASS, detail=f"weights, Adam state and {len(drawn)} random "
                                                 "draws (Python, numpy, Paddle) restored exactly")


# ---------------------------------------------------------------- export
def _exact_float32() -> None:
    """No TF32 in this process (Paddle Inference runs in it too, with its flags), so the
    comparison measures export, not TF32's 10-bit mantissa."""
    for flag in ("FLAGS_allow_tf32_cublas", "FLAGS_allow_tf32_cudnn"):
        try:
            paddle.set_flags({flag: False})
        except (ValueError, RuntimeError):
            pass                            # this build has no such flag


def export_predict(job: Job) -> Row:
    """LeNet through paddle_dist.export and Paddle Inference (predict.Predictor, on the
    GPU where there is one) against the dygraph outputs on the same input."""
    from paddle.static import InputSpec

    from .export import preprocessing
    from .models import build

    _exact_float32()
    paddle.seed(job.cfg.train.seed)
    net = build("lenet", 10)
    info = preprocessing(configlib.replace_key(job.cfg, "data.name", "mnist"))
    spec = InputSpec([None, *info.pop("input_shape")], "float32", "image")
    out = export_model(net, [spec], job.scratch / "export", {"task": "classification", **info})
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype("float32")
    net.eval()
    want = net(paddle.to_tensor(x)).numpy()
    got = Predictor(out).logits(x)
    diff = float(np.abs(got - want).max())
    where = "GPU" if job.env.device.startswith("gpu") else "CPU"
    return Row("export + predict", PASS if diff <= TOLERANCE else FAIL,
               detail=f"max |inference - dygraph| {diff:.1e} (Paddle Inference on {where})")
