"""The self-test's mixed-precision rows (`doctor --test`: AMP float16 / bfloat16, O1 / O2),
run by every rank. Where `amp.plan` refuses the dtype here (a CPU; a GPU without float16
or bfloat16) the row is a SKIP with its reason.

Each row trains as a GPU job trains by default: `sync.mode=dataparallel` (Paddle's
reducer, all-reducing inside backward()), at both API levels, against a float32 replay
of one process on the whole batch. float16 goes through paddle_dist's synced GradScaler.
O2 trains a network with a BatchNorm (kept in float32 by decorate): its statistics move
once per step from every rank's batch and must equal the replay's; then the trainer's
evaluate(), a checkpoint that resumes into a new O2 network and optimizer with every
tensor bit-identical (16-bit weights, BatchNorm statistics, master weights), and the
checkpoint's float32 weights exported and run by Paddle Inference.

Example:
    row = amp_step("bfloat16", "O2", job)    # Row('AMP bfloat16 O2', 'PASS', ...) on an A100
"""

from __future__ import annotations

import dataclasses

import numpy as np
import paddle

from .. import checkpoint
from ..compat import optimizer_state, state_tensors
from ..errors import DeviceError
from ..trainer import amp
from .checks import (AMP_TOLERANCE, BATCH, FAIL, LR, PASS, SKIP, STEPS, Job, Row, _exact_float32,
                     _export_and_predict, _global_batch, _max_difference, _net, train_against_replay, values)

MODE = "dataparallel"          # sync.mode=auto on GPUs


def amp_step(dtype: str, level: str, job: Job) -> Row:
    """`level` in `dtype` (see the module's docstring) against the float32 replay: finite,
    within AMP_TOLERANCE at both levels; O2 then goes through o2_after."""
    name = f"AMP {dtype} {level}" + (" + GradScaler" if dtype == "float16" else "")
    train = dataclasses.replace(job.cfg.train, amp=level, amp_dtype=dtype)
    try:
        precision = amp.plan(train, job.env.device)
    except DeviceError as exc:
        return Row(name, SKIP, detail=str(exc).split(";")[0])
    bn = level == "O2"
    net, ref, how, _, opt = train_against_replay(job, MODE, precision, bn=bn)
    hapi_net, hapi_ref, *_ = train_against_replay(job, MODE, precision, api="hapi", bn=bn)
    diff, hapi_diff = _max_difference(net, ref), _max_difference(hapi_net, hapi_ref)
    ok = all(np.isfinite(d) and d <= AMP_TOLERANCE for d in (diff, hapi_diff))
    what = "weights and BatchNorm statistics" if bn else "weights"
    detail = (f"max |{what} - float32 replay| {diff:.1e} (loop), {hapi_diff:.1e} (hapi) after {STEPS} "
              f"steps; {how}")
    if ok and level == "O2":
        problem, said = o2_after(job, net, ref, opt, precision)
        ok, detail = problem is None, problem or f"{detail}; {said}"
    digest = checkpoint.weights_digest(net) + checkpoint.weights_digest(hapi_net)
    return Row(name, PASS if ok else FAIL, digest=digest, detail=detail)


def o2_after(job: Job, net, ref, opt, precision: amp.AmpPlan):
    """An O2 network's evaluation (the trainer's evaluate(), every rank) against the float32
    replay's; its checkpoint resumed into a new O2 network and optimizer, bit-identical;
    (rank 0) the checkpoint's float32 weights loaded into a float32 network, exported and
    run. Returns (what went wrong or None, what was checked)."""
    from ..trainer.evaluation import EvalSetup, evaluate
    from ..trainer.feed import Feed
    from ..trainer.loading import Source

    x, y = _global_batch(STEPS, 1, job.cfg.train.seed)
    data = paddle.io.TensorDataset([paddle.to_tensor(x), paddle.to_tensor(y)])
    loss = paddle.nn.CrossEntropyLoss()
    got = evaluate(EvalSetup(net, Source.of(data, "eval_data"), Feed(net), loss, batch_size=BATCH, amp=precision),
                   job.env)
    want = evaluate(EvalSetup(ref, Source.of(data, "eval_data"), Feed(ref), loss, batch_size=BATCH), job.env)
    if not abs(got["loss"] - want["loss"]) <= AMP_TOLERANCE * 10 * max(1.0, abs(want["loss"])):
        return f"O2 evaluation: loss {got['loss']:.4f}, float32 replay {want['loss']:.4f}", ""
    meta = checkpoint.Meta(global_step=STEPS, epoch=0, step_in_epoch=STEPS, world_size=job.env.world_size,
                           model="selftest")
    state = checkpoint.load(checkpoint.save(job.scratch / "o2", net, opt, meta, keep_last=1))
    wide = sorted({str(v.dtype) for v in state.model.values()})
    if wide != ["float32"]:
        return f"O2 checkpoint weights are {', '.join(wide)}, not float32 (amp.decorate save_dtype)", ""
    differ = _resumed_differs(state, net, opt, precision)
    if differ:
        return f"O2 checkpoint resumed with other values in {', '.join(differ[:3])}", ""
    said = (f"evaluation loss {got['loss']:.4f} (replay {want['loss']:.4f}); checkpoint resumed "
            "bit-identical (16-bit weights, BatchNorm statistics, master weights)")
    if not job.env.is_main:
        return None, said
    plain = _net(bn=True)
    checkpoint.restore(state, plain, rng=False)
    _exact_float32()
    out = _export_and_predict(plain, job, [16])
    return None, f"{said}; float32 checkpoint exported, max |inference - dygraph| {out:.1e}"


def _resumed_differs(state, net, opt, precision: amp.AmpPlan):
    """The entries of a new O2 network and optimizer, restored from `state`, that differ
    from `net`'s and `opt`'s own (compared in their own dtype, as values)."""
    fresh = _net(bn=True)
    again, again_opt = amp.decorate(fresh, paddle.optimizer.SGD(LR, parameters=fresh.parameters()), precision)
    checkpoint.restore(state, again, again_opt, rng=False)
    mine, theirs = state_tensors(net), state_tensors(again)
    differ = [k for k in mine if mine[k].dtype != theirs[k].dtype
              or not np.array_equal(values(mine[k]), values(theirs[k]))]
    held, loaded = _master(opt), _master(again_opt)
    differ += [f"master weight {i}" for i in range(len(held))
               if len(loaded) != len(held) or not np.array_equal(held[i], loaded[i])]
    return differ


def _master(opt) -> list:
    """An optimizer's float32 master weights as arrays, in the order it holds them (by its
    parameters' names, which differ between two networks of one process: the restored
    optimizer holds the saved ones until its first step)."""
    return [values(v) for v in optimizer_state(opt).get("master_weights", {}).values()]
