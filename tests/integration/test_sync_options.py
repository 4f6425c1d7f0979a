"""Each gradient-sync option against Paddle's own DataParallel, on 2 real ranks.

This file is also the script: one `paddle.distributed.launch` of 2 ranks trains the same
network (same seed, same data order) once per variant in one process group, and each rank
writes every variant's final weights and sync counts to <out>/rank<N>.npz / .json.
"""

import argparse
import collections
import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.compat    # every sync mode, transport and compression

STEPS = 20
BATCH = 16             # per rank
SAMPLES = 640          # 20 steps of 2 x 16 per epoch
# name -> config overrides; "dataparallel" (Paddle's reducer inside backward) is the reference.
VARIANTS = {
    "dataparallel": ["sync.mode=dataparallel"],
    # Paddle's reducer without its search for parameters without a gradient: every
    # parameter of this network gets one, so it must equal the reference bit for bit.
    "dataparallel_all_used": ["sync.mode=dataparallel", "sync.find_unused_parameters=false"],
    "fused": ["sync.mode=fused"],                    # transport auto: shm on one machine
    "auto": [],                                      # the default: fused on one machine's CPUs
    # Buckets leave during backward() on the communication thread: shm, then gloo.
    "overlap": ["sync.mode=overlap"],
    "overlap_backend": ["sync.mode=overlap", "sync.transport=backend"],
    "hapi_overlap": ["train.api=hapi", "sync.mode=overlap", "sync.transport=backend"],
    "overlap_accumulate4": ["sync.mode=overlap", "sync.transport=backend",
                            f"train.batch_size={BATCH // 4}", "train.accumulate_steps=4"],
    "hapi_overlap_accumulate": ["train.api=hapi", "sync.mode=overlap", f"train.batch_size={BATCH // 2}",
                                "train.accumulate_steps=2"],
    "backend": ["sync.mode=fused", "sync.transport=backend"],      # one gloo all-reduce per step
    "buckets": ["sync.mode=fused", "sync.transport=backend", "sync.bucket_mb=0.001"],  # W1 | b1 | W2 b2
    "bf16": ["sync.mode=fused", "sync.compress=bf16"],
    "overlap_bf16": ["sync.mode=overlap", "sync.compress=bf16"],  # bf16 on the thread's buffers
    "accumulate": [f"train.batch_size={BATCH // 2}", "train.accumulate_steps=2"],
    "accumulate_dataparallel": ["sync.mode=dataparallel", f"train.batch_size={BATCH // 2}",
                                "train.accumulate_steps=2"],
    "hapi_fused": ["train.api=hapi"],
    # k micro-batches of B/k must equal one batch of B (the loss is each group's mean).
    "hapi_accumulate": ["train.api=hapi", f"train.batch_size={BATCH // 2}", "train.accumulate_steps=2"],
    "accumulate4": [f"train.batch_size={BATCH // 4}", "train.accumulate_steps=4"],
    "hapi_accumulate4": ["train.api=hapi", f"train.batch_size={BATCH // 4}", "train.accumulate_steps=4"],
    # float16 loss scaling, forced on (see force_loss_scaling): averaged before the inf check
    "loss_scaled": [],
    "hapi_loss_scaled": ["train.api=hapi"],
}
LOSS_SCALED = ("loss_scaled", "hapi_loss_scaled")


# ----------------------------------------------------------------- the script
def make_net(paddle):
    paddle.seed(7)
    return paddle.nn.Sequential(paddle.nn.Linear(784, 24), paddle.nn.ReLU(), paddle.nn.Linear(24, 10))


@contextlib.contextmanager
def force_loss_scaling(amp):
    """Paddle turns AMP off on CPU (its auto_cast and GradScaler do nothing there). Force
    the loss scaler on, so that 2 real ranks prove the scaled path (gradients averaged
    before the scaler's inf/nan check, then unscaled) trains exactly like the plain one."""
    plan, scaler_class = amp.plan, amp.synced_scaler_class
    unscaled = []          # the scale at each unscale: the scaled path really ran

    def forced_class():
        import paddle
        from paddle.amp.grad_scaler import _refresh_optimizer_state

        class Forced(scaler_class()):
            def __init__(self, sync, init_loss_scaling):
                super().__init__(sync, init_loss_scaling)
                # What GradScaler.__init__ sets up when it is enabled (on a GPU).
                self._enable = self._use_dynamic_loss_scaling = True
                self._init_loss_scaling, self._incr_ratio, self._decr_ratio = init_loss_scaling, 2.0, 0.5
                self._incr_every_n_steps, self._decr_every_n_nan_or_inf = 1000, 2
                self._incr_count = self._decr_count = 0
                (self._found_inf, self._temp_found_inf_value_false, self._temp_found_inf_fp16,
                 self._temp_found_inf_bf16, self._temp_found_inf_fp32) = (
                    paddle.to_tensor(np.array([0]).astype(np.bool_)) for _ in range(5))
                self._scale = paddle.to_tensor(np.array([init_loss_scaling], dtype=np.float32))
                self._cache_found_inf = None
                self._optimizer_states = collections.defaultdict(_refresh_optimizer_state)

            def _unscale(self, optimizer):
                unscaled.append(float(self._scale.numpy()[0]))
                return super()._unscale(optimizer)
        return Forced

    amp.plan = lambda train, device, bf16_supported=None: amp.AmpPlan("O1", "float16", 1024.0)
    amp.synced_scaler_class = forced_class
    try:
        yield unscaled
    finally:
        amp.plan, amp.synced_scaler_class = plan, scaler_class


def train_all(out: Path, names, batch: int) -> None:
    import paddle

    import paddle_dist
    from paddle_dist.trainer import amp
    from paddle_dist.data.datasets import mnist_dataset

    train_data = mnist_dataset("", "train", flatten=True)
    train_data.x, train_data.y = train_data.x[:SAMPLES], train_data.y[:SAMPLES]
    rank, weights, info = None, {}, {}
    for key, value in make_net(paddle).state_dict().items():
        weights[f"initial/{key}"] = value.numpy()
    for name in names:
        # The cosine schedule these tolerances were measured with (load_config() alone is
        # the typed defaults: a constant rate).
        cfg = paddle_dist.load_config(overrides=[
            "train.lr_schedule=cosine",
            f"train.batch_size={batch}", f"train.max_steps={STEPS}", "train.epochs=1",
            "checkpoint.every_epochs=0", "train.log_every=100", f"output.run_dir={out}/{name}",
            "dist.hang_timeout=0",      # (no watchdog process per variant: the launch is bounded)
            *VARIANTS[name]])
        env = paddle_dist.setup(cfg)
        rank = env.global_rank
        net = make_net(paddle)
        with force_loss_scaling(amp) if name in LOSS_SCALED else contextlib.nullcontext() as unscaled:
            result = paddle_dist.fit(net, train_data, config=cfg,
                                     optimizer=lambda ps: paddle.optimizer.SGD(0.05, parameters=ps))
        for key, value in net.state_dict().items():
            weights[f"{name}/{key}"] = value.numpy()
        info[name] = {"steps": result.steps, "comm_calls": result.comm_calls,
                      "transport": result.sync_transport, "world_size": env.world_size,
                      "unscaled": unscaled}
    np.savez(out / f"rank{rank}.npz", **weights)
    (out / f"rank{rank}.json").write_text(json.dumps(info))


# ----------------------------------------------------------------- the tests
if __package__:
    from .procs import check, run

SCRIPT = str(Path(__file__).resolve())


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync")
    check(run(["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
               str(out / "log"), SCRIPT, "--out", str(out)], timeout=300))
    return [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
            for r in (0, 1)]


# 4 ranks with half the batch each: the same 20 steps of the same global batch.
# (fused, overlap over gloo and hapi on 4 ranks, against a one-process replay:
# test_replay_matrix.py's four-rank rows.)
FOUR_RANKS = ["dataparallel", "overlap"]


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync4")
    check(run(["-m", "paddle.distributed.launch", "--nproc_per_node", "4", "--log_dir",
               str(out / "log"), SCRIPT, "--out", str(out), "--variants", ",".join(FOUR_RANKS),
               "--batch", str(BATCH // 2)], timeout=300))
    return [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
            for r in range(4)]


def test_four_ranks_equal_paddle_dataparallel_and_agree_bit_for_bit(four_ranks):
    weights = four_ranks[0][0]
    for name in FOUR_RANKS:
        assert all(info[name]["world_size"] == 4 and info[name]["steps"] == STEPS
                   for _, info in four_ranks), name
        for other, _ in four_ranks[1:]:
            assert max_diff(variant(weights, name), variant(other, name)) == 0.0, name
        assert max_diff(variant(weights, name), variant(weights, "dataparallel")) <= 1e-6, name
        assert max_diff(variant(weights, name), variant(weights, "initial")) > 1e-2, name
    info = four_ranks[0][1]
    assert info["overlap"]["transport"] == "shm" and info["overlap"]["comm_calls"] == 2 * STEPS


def variant(weights, name):
    return {k.split("/", 1)[1]: v for k, v in weights.items() if k.startswith(name + "/")}


def max_diff(a, b):
    assert a.keys() == b.keys() and a
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def test_every_variant_ran_on_two_ranks_and_the_ranks_agree_bit_for_bit(ranks):
    (w0, info0), (w1, info1) = ranks
    for name in VARIANTS:
        assert info0[name]["world_size"] == 2 and info0[name]["steps"] == STEPS, name
        assert max_diff(variant(w0, name), variant(w1, name)) == 0.0, name


@pytest.mark.parametrize("name", ["dataparallel_all_used", "fused", "auto", "overlap", "overlap_backend", "hapi_overlap",
                                  "overlap_accumulate4", "hapi_overlap_accumulate",
                                  "backend", "buckets", "accumulate",
                                  "accumulate_dataparallel", "hapi_fused", "hapi_accumulate",
                                  "accumulate4", "hapi_accumulate4", *LOSS_SCALED])
def test_exact_options_equal_paddle_dataparallel(ranks, name):
    weights = ranks[0][0]
    reference = variant(weights, "dataparallel")
    assert max_diff(variant(weights, name), reference) <= 1e-6
    # ...and training moved the weights far more than that: the comparison means something.
    assert max_diff(variant(weights, name), variant(weights, "initial")) > 1e-2


def test_loss_scaling_averages_before_unscaling_once_per_step(ranks):
    info = ranks[0][1]
    for name in LOSS_SCALED:
        assert info[name]["unscaled"] == [1024.0] * STEPS, name
        assert info[name]["comm_calls"] == STEPS, name        # averaged once, not twice


@pytest.mark.parametrize("name", ["bf16", "overlap_bf16"])
def test_bf16_compression_is_close_but_approximate(ranks, name):
    weights = ranks[0][0]
    diff = max_diff(variant(weights, name), variant(weights, "dataparallel"))
    assert 0 < diff <= 5e-3        # 8 mantissa bits: documented as approximate
    assert ranks[0][1][name]["transport"] == "backend"


def test_communication_counts(ranks):
    info = ranks[0][1]
    assert info["fused"]["transport"] == info["hapi_fused"]["transport"] == "shm"
    assert info["backend"]["transport"] == info["bf16"]["transport"] == "backend"
    assert info["fused"]["comm_calls"] == STEPS             # one round, stop flag included
    assert info["backend"]["comm_calls"] == STEPS           # one buffer, stop flag included
    assert info["buckets"]["comm_calls"] == 3 * STEPS
    assert info["auto"]["transport"] == "shm" and info["auto"]["comm_calls"] == STEPS
    # Overlap: [b2 w2 b1] then w1 (a quarter of the model at most per bucket), in backward's
    # order; with accumulation still once per optimizer step.
    assert info["overlap"]["transport"] == "shm"
    assert info["overlap_bf16"]["comm_calls"] == 2 * STEPS
    assert info["overlap_backend"]["transport"] == info["hapi_overlap"]["transport"] == "backend"
    for name in ("overlap", "overlap_backend", "hapi_overlap", "overlap_accumulate4",
                 "hapi_overlap_accumulate"):
        assert info[name]["comm_calls"] == 2 * STEPS, name
    for name in ("accumulate", "accumulate4", "hapi_accumulate", "hapi_accumulate4"):
        assert info[name]["comm_calls"] == STEPS, name      # k micro-batches, one exchange
    # With the reducer only the stop flag is exchanged, about once a second, at steps that
    # rank 0 picks and every rank follows: step 1, then a few more at most in 20 steps.
    calls = [rank[1]["dataparallel"]["comm_calls"] for rank in ranks]
    assert calls[0] == calls[1] and 1 <= calls[0] <= STEPS


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args()
    train_all(Path(args.out), args.variants.split(","), args.batch)
