"""Unit tests for paddle_dist.doctor.checks: the self-test's rank-side checks, in this process (a
fake second rank where one is needed): all-reduce, gradient sync, checkpoint round trip, skips."""

from __future__ import annotations

import paddle
import pytest

from paddle_dist import checkpoint, config
from paddle_dist.doctor import checks, checks_amp, selftest_plan
from paddle_dist.runtime.env import DistEnv
from paddle_dist.doctor.checks import Job

from tests.unit.doctor.test_selftest import job  # noqa: F401  (fixtures)


def two_rank_job(tmp_path, rank: int = 0):
    env = DistEnv(launcher="paddle_launch", global_rank=rank, world_size=2, backend="gloo")
    return Job(config.with_overrides([]), env, tmp_path)


def summed_by_two_ranks(tensor):
    """An all-reduce stand-in: rank 0's tensor plus rank 1's (which is twice rank 0's)."""
    tensor.set_value(tensor * 3)


# ---------------------------------------------------------------- rank-side checks
@pytest.mark.parametrize("dtype", selftest_plan.DTYPES)
def test_all_reduce_passes_on_the_right_sum(tmp_path, dtype):
    row = checks.all_reduce(dtype, two_rank_job(tmp_path), reduce=summed_by_two_ranks)
    assert (row.check, row.status) == (f"all-reduce {dtype}", "PASS")


def test_a_wrong_all_reduce_result_fails(tmp_path):
    """An injected wrong result: the collective left the tensor as it was."""
    row = checks.all_reduce("float32", two_rank_job(tmp_path), reduce=lambda t: None)
    assert row.status == "FAIL"
    assert row.detail == "value 0: got -4, expected -12"


def test_gloo_float16_is_a_skip_with_the_reason_not_a_failure(tmp_path):
    """Paddle's gloo sums float16 into inf (sync/transports.py: check): a known limit that
    paddle_dist avoids, reported as such; any other wrong dtype fails."""
    def paddles_gloo(t):
        t.set_value(paddle.full(t.shape, float("inf"), dtype=t.dtype))

    row = checks.all_reduce("float16", two_rank_job(tmp_path), reduce=paddles_gloo)
    assert row.status == "SKIP" and "paddle_dist sends no float16 over gloo" in row.detail
    assert checks.all_reduce("bfloat16", two_rank_job(tmp_path), reduce=paddles_gloo).status == "FAIL"

    def unsupported(t):
        raise RuntimeError("Invalid datatype bfloat16 for gloo")

    row = checks.all_reduce("bfloat16", two_rank_job(tmp_path), reduce=unsupported)
    assert row.status == "SKIP" and "Invalid datatype bfloat16 for gloo" in row.detail
    with pytest.raises(RuntimeError):
        checks.all_reduce("float32", two_rank_job(tmp_path), reduce=unsupported)


def test_one_rank_and_cpu_skip_what_they_cannot_test(job):
    for row in (checks.all_reduce("float32", job), checks.grad_sync("fused", job)):
        assert row.status == "SKIP" and row.detail.startswith("one rank: nothing to exchange")
    for dtype in ("float16", "bfloat16"):
        for level in ("O1", "O2"):
            row = checks_amp.amp_step(dtype, level, job)       # amp.plan's reason
            assert row.status == "SKIP" and row.detail.startswith(f"train.amp={level} needs a GPU"), row.detail
    row = checks.side_stream_overlap(job)
    assert row.status == "SKIP" and row.detail.startswith("GPUs only")


def test_checkpoint_round_trip_passes_and_a_broken_restore_fails(job, monkeypatch):
    row = checks.checkpoint_round_trip(job)
    assert row.status == "PASS", row.detail
    monkeypatch.setattr(checkpoint, "restore", lambda *args, **kwargs: None)
    broken = checks.checkpoint_round_trip(Job(job.cfg, job.env, job.scratch / "again"))
    assert broken.status == "FAIL" and broken.detail.startswith("not restored: ")


def test_tf32_is_switched_off_with_paddles_own_switches(monkeypatch):
    """FLAGS_allow_tf32_* exist in no Paddle build (setting them raised, and was swallowed);
    core.set_cublas_switch / set_cudnn_switch are what GPU builds have."""
    from paddle.base import core

    turned = {}
    for switch in ("set_cublas_switch", "set_cudnn_switch"):
        monkeypatch.setattr(core, switch, lambda on, _name=switch: turned.__setitem__(_name, on), raising=False)
    checks._exact_float32()
    assert turned == {"set_cublas_switch": False, "set_cudnn_switch": False}


def test_the_hapi_level_trains_as_the_loop_does_against_the_replay(job):
    """The AMP rows (GPUs only) train at both API levels; here the same path in float32:
    the prepared paddle.Model (trainer.hapi.prepared_model) ends where the replay does."""
    from paddle_dist.doctor.checks import TOLERANCE, _max_difference, train_against_replay

    loop_net, loop_ref, *_ = train_against_replay(job, "fused")
    hapi_net, hapi_ref, *_ = train_against_replay(job, "fused", api="hapi")
    assert _max_difference(hapi_net, hapi_ref) <= TOLERANCE
    assert checkpoint.weights_digest(hapi_net) == checkpoint.weights_digest(loop_net)
