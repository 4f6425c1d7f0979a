"""The self-test's checks (`python -m paddle_dist.doctor --test`), each run by every rank
of a real job (selftest_rank.py runs them, selftest.py starts the job and prints the
table). Each returns a Row: PASS, FAIL, or SKIP with the reason it cannot run here. The
mixed-precision rows are in checks_amp.py. Numbers are compared as values, never as the
raw bits a bfloat16 tensor's numpy() gives.

The doctor's rank side: paddle code through and through, imported only by the functions
a self-test rank runs, so that loading doctor/ (the report, the parent of the self-test)
imports no paddle.

They use paddle_dist's own code paths: `GradSync` built from the config as the trainer
builds it, `trainer.engine.Engine` (the trainer's distributed step), `checkpoint.save()` /
`load()` / `restore()`, `amp.plan` / `amp.scaler`, `export` and `predict.Predictor`.

Example:
    row = grad_sync("overlap", Job(cfg, env, scratch))   # Row('grad sync overlap', 'PASS', ...)
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, List

import numpy as np
import paddle
import paddle.distributed as dist

from ..trainer import amp
from .. import checkpoint
from .. import config as configlib
from ..runtime import env as envlib
from ..sync.collectives import first_line
from ..errors import DeviceError
from ..export import export as export_model
from ..predict import Predictor
from ..compat import state_tensors
from ..sync import GradSync
from ..sync.batchstats import BatchStats
from ..trainer.engine import Engine, step as plain_step
from ..trainer.feed import Feed

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
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
    if half and dtype == "float16":       # transports.check refuses fp16 on gloo for this
        return Row(name, SKIP, detail=f"Paddle's gloo sums float16 wrongly ({wrong}); "
                                      "paddle_dist sends no float16 over gloo")
    return Row(name, FAIL, detail=wrong)


# ---------------------------------------------------------------- gradient sync
def _net(bn: bool = False) -> paddle.nn.Layer:
    """A small MLP; `bn`: with a BatchNorm (kept in float32 by O2's decorate)."""
    norm = [paddle.nn.BatchNorm1D(32)] if bn else []
    return paddle.nn.Sequential(paddle.nn.Linear(16, 32), *norm, paddle.nn.ReLU(), paddle.nn.Linear(32, 4))


def _twins(seed: int, bn: bool = False):
    """The network to train and its one-process replay, with the same initial weights."""
    paddle.seed(seed)
    net = _net(bn)
    paddle.seed(seed)
    return net, _net(bn)


def _global_batch(step: int, world: int, seed: int):
    rng = np.random.default_rng(seed + step)
    x = rng.standard_normal((BATCH * world, 16)).astype("float32")
    y = rng.integers(0, 4, BATCH * world).astype("int64")
    return x, y


def _tensors(x, y):
    """One batch as engine.step takes it: ([input], [label])."""
    return [paddle.to_tensor(x)], [paddle.to_tensor(y)]


def values(tensor) -> np.ndarray:
    """A tensor's values as float64: a bfloat16 tensor's numpy() is its raw bits (uint16)."""
    return tensor.astype("float32").numpy().astype("float64")


def _max_difference(net, ref) -> float:
    """The largest difference between the two networks' parameters and buffers, as values."""
    mine, theirs = state_tensors(net), state_tensors(ref)
    return max(float(np.abs(values(mine[k]) - values(theirs[k])).max()) for k in theirs)


def train_against_replay(job: Job, mode: str, precision=amp.AmpPlan(), api: str = "loop",
                         bn: bool = False):
    """STEPS optimizer steps of a small MLP (`bn`: with a BatchNorm, whose statistics move
    once per step from every rank's batch, sync/batchstats.py), data-parallel through
    GradSync(`mode`) and the trainer's own step at `api` level (loop: `trainer.engine.Engine.step`;
    hapi: the prepared paddle.Model's train_batch, as `trainer.hapi` builds it), beside one
    process taking the same steps on the whole batch in float32, each rank's share a
    micro-batch. Returns (net, replay, the sync's description, its exchange's class name,
    the optimizer)."""
    env, seed = job.env, job.cfg.train.seed
    net, ref = _twins(seed, bn)
    opt = paddle.optimizer.SGD(LR, parameters=net.parameters())
    ref_opt = paddle.optimizer.SGD(LR, parameters=ref.parameters())
    net, opt = amp.decorate(net, opt, precision)       # O2: 16-bit weights, float32 master copy
    sync = GradSync.from_config(env, dataclasses.replace(job.cfg.sync, mode=mode, compress="none"))
    engine = Engine(net, opt, env, sync, precision)
    loss = paddle.nn.CrossEntropyLoss()
    if api == "hapi":
        from ..trainer.hapi import prepared_model

        model = prepared_model(engine, loss, inputs=1)

        def step(x, y):
            model.train_batch([paddle.to_tensor(x)], [paddle.to_tensor(y)])
    else:
        wrapped = engine.wrapped()

        def step(x, y):
            engine.step(wrapped, [_tensors(x, y)], Feed(net, inputs=1), loss)
    # The replay takes each rank's share as a micro-batch of one step: BatchNorm normalizes
    # each share by its own statistics, as on the ranks, and its running statistics move
    # once per step from all of them (a BatchStats of one process).
    ref_stats = BatchStats(ref, SimpleNamespace(is_distributed=False))
    shares = [slice(r * BATCH, (r + 1) * BATCH) for r in range(env.world_size)]
    try:
        for n in range(STEPS):
            x, y = _global_batch(n, env.world_size, seed)
            step(x[shares[env.global_rank]], y[shares[env.global_rank]])
            engine.after_update()
            plain_step(ref, loss, [_tensors(x[share], y[share]) for share in shares], ref_opt)
            ref_stats.step()
        exchange = type(sync.overlap.exchange).__name__ if sync.overlap is not None else "step"
        return net, ref, sync.describe(), exchange, opt
    finally:
        engine.close()
        ref_stats.close()


def grad_sync(mode: str, job: Job) -> Row:
    """Ranks' weights after GradSync(`mode`) against the one-process replay (within
    TOLERANCE); the parent checks that the ranks' weights are bit-identical."""
    name = f"grad sync {mode}"
    if not job.env.is_distributed:
        return Row(name, SKIP, detail=ONE_RANK)
    net, ref, how, _, _ = train_against_replay(job, mode)
    diff = _max_difference(net, ref)
    return Row(name, PASS if diff <= TOLERANCE else FAIL, digest=checkpoint.weights_digest(net),
               detail=f"max |w - one-process replay| {diff:.1e} after {STEPS} steps; {how}")


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
    plain_step(net, loss, [(x, y)], opt)
    scaler = _moved_scaler(job)
    meta = checkpoint.Meta(global_step=1, epoch=0, step_in_epoch=1, world_size=job.env.world_size,
                           model="selftest", loss_scaler=amp.scaler_state(scaler) if scaler is not None else None)
    path = checkpoint.save(job.scratch / "checkpoints", net, opt, meta, keep_last=1)
    weights, moments, drawn = _arrays(net.state_dict()), _arrays(opt.state_dict()), _draws()
    plain_step(net, loss, [(x, y)], opt)        # everything moves on
    state = checkpoint.load(path)
    checkpoint.restore(state, net, opt, rng=True)
    devices = [scalars[0] for scalars in state.rng_info["paddle"]]
    if job.env.device.startswith("gpu") and int(job.env.device.split(":")[1]) not in devices:
        return Row("checkpoint + RNG", FAIL, detail=f"the checkpoint holds the generators of devices "
                                                     f"{devices}, not {job.env.device}'s own")
    if scaler is not None:
        resumed = _moved_scaler(job, moved=False)
        amp.load_scaler_state(resumed, state.record.loss_scaler or {})
        if amp.scaler_state(resumed) != amp.scaler_state(scaler) or not amp.scaler_state(scaler):
            return Row("checkpoint + RNG", FAIL, detail=f"loss scaler {amp.scaler_state(scaler)} came back "
                                                         f"as {amp.scaler_state(resumed)}")
    wrong = [k for k, v in _arrays(net.state_dict()).items() if not np.array_equal(v, weights[k])]
    wrong += [k for k, v in _arrays(opt.state_dict()).items() if not np.array_equal(v, moments.get(k))]
    if wrong:
        return Row("checkpoint + RNG", FAIL, detail=f"not restored: {', '.join(wrong[:3])}")
    again = _draws()
    if again != drawn:
        return Row("checkpoint + RNG", FAIL, detail=f"random numbers differ: {drawn} then {again}")
    kept = "Adam state, loss scaler" if scaler is not None else "Adam state"
    return Row("checkpoint + RNG", PASS, detail=f"weights, {kept} and {len(drawn)} random draws "
                                                 f"(Python, numpy, Paddle on {job.env.device}) restored exactly")


def _moved_scaler(job: Job, moved: bool = True):
    """A float16 loss scaler as the trainer builds it, its scale and counters moved from
    where train.loss_scale starts them (moved=True); None where amp.plan refuses float16
    (a CPU, a GPU without it: the AMP rows say why)."""
    train = dataclasses.replace(job.cfg.train, amp="O1", amp_dtype="float16")
    try:
        scaler = amp.scaler(amp.plan(train, job.env.device), sync=None)
    except DeviceError:
        return None
    if moved:
        amp.load_scaler_state(scaler, {"scale": train.loss_scale * 4, "incr_count": 5, "decr_count": 1})
    return scaler


# ---------------------------------------------------------------- export
def _exact_float32() -> None:
    """No TF32 in this process (Paddle Inference runs in it too), so the comparisons
    measure export and mixed precision, not TF32's 10-bit mantissa. Paddle's switches
    (core.set_cublas_switch, set_cudnn_switch; GPU builds have them) are process-wide:
    no FLAGS_allow_tf32_* exists in 2.6 or 3.x."""
    from paddle.base import core

    for switch in ("set_cublas_switch", "set_cudnn_switch"):
        turn = getattr(core, switch, None)
        if turn is not None:
            turn(False)


def _mnist_preprocessing(job: Job) -> Dict:
    from ..data.registry import preprocessing

    return preprocessing(configlib.replace_key(job.cfg, "data.name", "mnist"))


def _export_and_predict(net, job: Job, shape: List[int]) -> float:
    """`net` (inputs of `shape`, batch first) exported and run by Paddle Inference on the
    job's device; the largest difference from the dygraph outputs on the same input."""
    from paddle.static import InputSpec

    info = _mnist_preprocessing(job)
    info.pop("input_shape")            # deploy.json's metadata; the network takes `shape`
    spec = InputSpec([None, *shape], "float32", "image")
    out = export_model(net, [spec], job.scratch / f"export-{len(list(job.scratch.glob('export-*')))}",
                       {"task": "classification", **info})
    x = np.random.default_rng(0).standard_normal((4, *shape)).astype("float32")
    net.eval()
    want = net(paddle.to_tensor(x)).numpy()
    got = Predictor(out, device=job.env.device).logits(x)
    return float(np.abs(got - want).max())


def export_predict(job: Job) -> Row:
    """LeNet through paddle_dist.export and Paddle Inference (predict.Predictor, on the
    job's GPU where it has one), with TF32 off, against the dygraph outputs."""
    from ..models import build

    _exact_float32()
    paddle.seed(job.cfg.train.seed)
    shape = _mnist_preprocessing(job)["input_shape"]
    diff = _export_and_predict(build("lenet", 10), job, list(shape))
    where = job.env.device.upper().replace(":", " ") if job.env.device.startswith("gpu") else "CPU"
    tf32 = ", TF32 off" if job.env.device.startswith("gpu") else ""
    return Row("export + predict", PASS if diff <= TOLERANCE else FAIL,
               detail=f"max |inference - dygraph| {diff:.1e} (Paddle Inference on {where}{tf32})")


# ---------------------------------------------------------------- a second CUDA stream
def side_stream_overlap(job: Job) -> Row:
    """GPUs: the overlap exchange (AsyncExchange, from backward()'s hooks) with a stand-in
    two-rank sum issued on a second CUDA stream, as NCCL issues its all-reduce: the
    gradients must come back bit-identical to one process's (x * 2 / 2 is exact)."""
    from ..sync.overlap import AsyncExchange, Overlap

    name = "overlap on a CUDA side stream"
    if not job.env.device.startswith("gpu"):
        return Row(name, SKIP, detail="GPUs only: a second CUDA stream")
    cuda = paddle.device.cuda
    side = cuda.Stream()

    class Task:
        def __init__(self, event):
            self.event = event

        def wait(self):
            cuda.current_stream().wait_event(self.event)

    def two_ranks(tensor, sync_op=False):
        side.wait_stream(cuda.current_stream())
        with cuda.stream_guard(side):
            paddle.assign(tensor * 2, tensor)        # this rank's and an identical rank's
        event = cuda.Event()
        event.record(side)
        return Task(event)

    net, ref = _twins(job.cfg.train.seed)
    x, y = _tensors(*_global_batch(0, 1, job.cfg.train.seed))
    loss = paddle.nn.CrossEntropyLoss()
    loss(ref(*x), *y).backward()
    exchange = AsyncExchange(2, collective_fn=two_ranks)
    overlapped = Overlap(net.parameters(), exchange, 1 << 10)     # small buckets: several
    try:
        loss(net(*x), *y).backward()
        overlapped.finish()
    finally:
        overlapped.close()
    wrong = [p.name for p, r in zip(net.parameters(), ref.parameters())
             if not np.array_equal(p.grad.numpy(), r.grad.numpy())]
    if wrong:
        return Row(name, FAIL, detail=f"gradients differ from one process's: {', '.join(wrong[:3])}")
    return Row(name, PASS, detail=f"{exchange.calls} buckets summed on a second stream during "
                                  "backward(); gradients bit-identical to one process's")
