"""Unit tests for paddle_dist.doctor.checks_amp: what the O2 rows do after training, on a CPU."""

from __future__ import annotations

from paddle_dist.doctor import checks, checks_amp

from tests.unit.doctor.test_selftest import job  # noqa: F401  (fixtures)


def test_the_o2_rows_evaluation_checkpoint_and_export_run_through_on_cpu(job):
    """What the O2 rows do after training, run here on a float32 network with BatchNorm
    (tests/integration/test_selftest.py runs them at O2 under the GPU stand-in): the
    trainer's evaluate(), a checkpoint that resumes bit-identical, export and Paddle
    Inference."""
    from paddle_dist.trainer import amp

    net, ref, how, exchange, opt = checks.train_against_replay(job, "fused", bn=True)
    assert checks._max_difference(net, ref) <= checks.TOLERANCE        # BatchNorm statistics too
    problem, said = checks_amp.o2_after(job, net, ref, opt, amp.AmpPlan())
    assert problem is None, problem
    assert said.startswith("evaluation loss") and "checkpoint resumed bit-identical" in said
    assert "float32 checkpoint exported" in said
