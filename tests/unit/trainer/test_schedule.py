"""The learning-rate policy: scaling by the global batch, warm-up and decay."""

import math

import pytest

from paddle_dist import config
from paddle_dist.errors import ConfigError
from paddle_dist.trainer.schedule import LrPolicy, scaled_lr


def train_cfg(*overrides):
    """The typed defaults (constant rate, no warm-up), not a bundled config file's."""
    return config.with_overrides(list(overrides)).train


def policy(world_size, *overrides, steps_per_epoch=100, total=1000):
    return LrPolicy.from_config(train_cfg(*overrides), world_size, steps_per_epoch, total)


@pytest.mark.parametrize("scaling, expected", [
    # lr 0.1 for 256 samples; 64 per rank: global batch 64, 128, 512
    ("linear", {1: 0.025, 2: 0.05, 8: 0.2}),
    ("sqrt", {1: 0.05, 2: 0.1 * math.sqrt(0.5), 8: 0.1 * math.sqrt(2)}),
    ("none", {1: 0.1, 2: 0.1, 8: 0.1}),
])
def test_effective_lr_for_1_2_and_8_ranks(scaling, expected):
    for world, lr in expected.items():
        p = policy(world, "train.lr=0.1", "train.batch_size=64", f"train.lr_scaling={scaling}")
        assert p.peak == pytest.approx(lr)
        assert p.at(0) == p.at(999) == pytest.approx(lr)      # constant, no warm-up


def test_accumulation_counts_in_the_global_batch():
    p = policy(2, "train.lr=0.1", "train.batch_size=32", "train.accumulate_steps=4",
               "train.lr_scaling=linear")
    assert p.peak == pytest.approx(0.1)          # 32 x 2 x 4 = 256 = the reference
    assert scaled_lr(0.1, "linear", 512, 256) == pytest.approx(0.2)


def test_warmup_ramps_linearly_to_the_peak():
    p = policy(1, "train.lr=0.4", "train.lr_reference_batch=64", "train.warmup_epochs=2",
               steps_per_epoch=10)
    assert p.warmup_steps == 20
    assert [round(p.at(s), 6) for s in (0, 9, 19, 20, 500)] == [0.02, 0.2, 0.4, 0.4, 0.4]


def test_cosine_reaches_zero_at_the_last_step_after_warmup():
    p = policy(1, "train.lr=0.1", "train.lr_reference_batch=64", "train.warmup_epochs=1",
               "train.lr_schedule=cosine", steps_per_epoch=10, total=110)
    assert p.at(9) == pytest.approx(0.1)
    assert p.at(10) == pytest.approx(0.1)                      # the decay starts at the peak
    assert p.at(60) == pytest.approx(0.05)                     # half way
    assert p.at(110) == pytest.approx(0.0, abs=1e-12)
    assert all(p.at(s) >= p.at(s + 1) for s in range(10, 110))


def test_step_decay_after_each_milestone_epoch():
    p = policy(1, "train.lr=1", "train.lr_reference_batch=64", "train.lr_schedule=step",
               "train.lr_milestones=3,5", "train.lr_gamma=0.5", steps_per_epoch=10)
    assert [p.at(s) for s in (29, 30, 49, 50, 99)] == [1.0, 0.5, 0.5, 0.25, 0.25]


def test_describe_states_the_effective_values():
    cfg = train_cfg("train.lr=0.1", "train.batch_size=64", "train.lr_scaling=linear",
                    "train.warmup_epochs=1")
    text = LrPolicy.from_config(cfg, 8, 100, 1000).describe(cfg, 8, 0.1)
    assert text.startswith("lr 0.2: 0.1 for a global batch of 256, linear scaling to 512")
    assert "64 x 8 rank(s) x 1 micro-batch(es)" in text and "warm-up over 100 steps" in text


def test_describe_says_when_warm_up_outlasts_the_run():
    cfg = train_cfg("train.warmup_epochs=1", "train.lr_schedule=cosine")
    text = LrPolicy.from_config(cfg, 2, 26, 5).describe(cfg, 2, 0.001)
    assert text.endswith("; warm-up over 26 steps, more than the 5 this run makes: the rate "
                         "never reaches its peak") and "cosine" not in text


@pytest.mark.parametrize("overrides, message", [
    (["train.lr_schedule=step"], "needs train.lr_milestones"),
    (["train.lr_milestones=30,60"], "applies to train.lr_schedule=step"),
    (["train.lr_schedule=step", "train.lr_milestones=60,30"], "must be increasing epochs"),
    (["train.lr_schedule=step", "train.lr_milestones=x"], "must be increasing epochs"),
    (["train.lr_scaling=cubic"], "train.lr_scaling must be one of none, linear, sqrt"),
    (["train.warmup_epochs=-1"], "train.warmup_epochs must be >= 0"),
])
def test_bad_schedules_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config.load(overrides=overrides)
