"""The best checkpoint and the monitor (trainer/selection.py)."""

import pytest

from paddle_dist.config import Config, derived, validate
from paddle_dist.errors import ConfigError
from paddle_dist.trainer.selection import Best


def test_which_way_is_better():
    assert Best("eval_miou").higher_is_better and Best("eval_accuracy").higher_is_better
    assert not Best("eval_loss").higher_is_better and not Best("eval_error").higher_is_better


def test_monitor_and_ema_decay_are_checked():
    validate(derived(Config(), {"checkpoint.monitor": "eval_miou"}))
    with pytest.raises(ConfigError, match="eval_<metric>"):
        validate(derived(Config(), {"checkpoint.monitor": "miou"}))
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        validate(derived(Config(), {"train.ema_decay": 1.0}))
