"""train.deterministic (runtime/determinism.py): on a GPU rank, Paddle's switches for
deterministic cuDNN and embedding kernels are set before the first kernel; nothing on a
CPU, nothing when switched off, a user's own environment setting wins, and a build
without a flag (set_flags raises, as Paddle's does for an unknown flag) is left alone."""

import paddle
import pytest

from paddle_dist import config
from paddle_dist.runtime import determinism


class Flags:
    def __init__(self, known=tuple(determinism.FLAGS)):
        self.known, self.set = known, {}

    def __call__(self, flags):
        for name, value in flags.items():
            if name not in self.known:
                raise ValueError(f"Flag {name} cannot set its value through this function.")
            self.set[name] = value


def test_a_gpu_rank_gets_both_switches():
    flags = Flags()
    assert determinism.apply(True, "gpu:3", flags, environ={}) == determinism.FLAGS
    assert flags.set == {"FLAGS_cudnn_deterministic": True, "FLAGS_embedding_deterministic": 1}


@pytest.mark.parametrize("deterministic, device", [(True, "cpu"), (False, "gpu:0")])
def test_a_cpu_rank_or_the_switch_off_sets_nothing(deterministic, device):
    flags = Flags()
    assert determinism.apply(deterministic, device, flags, environ={}) == {}
    assert flags.set == {}


def test_the_users_own_setting_and_a_build_without_the_flag_are_left_alone():
    flags = Flags(known=("FLAGS_cudnn_deterministic",))
    chosen = determinism.apply(True, "gpu:0", flags, environ={"FLAGS_cudnn_deterministic": "0"})
    assert chosen == {} and flags.set == {}


def test_it_is_on_by_default_and_the_gpu_flags_are_unknown_to_a_cpu_build():
    assert config.load(None, []).train.deterministic is True
    assert config.load(None, ["train.deterministic=false"]).train.deterministic is False
    with pytest.raises(ValueError):       # what apply() skips on a CPU build
        paddle.set_flags({"FLAGS_cudnn_deterministic": True})
