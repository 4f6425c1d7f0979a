"""A model built before paddle_dist seeds an unseeded Paddle is named; one built after,
or after the user's own paddle.seed, is not. Each case in a fresh interpreter: its
unique-name counters and its generator as a script's start has them."""

import pytest

from tests.unit.conftest import ROOT

BUILD = "import paddle\nfrom paddle_dist.runtime import process, seedorder\n"
SAID = "print(repr(seedorder.made_before_seed(net, 42)))"


@pytest.mark.parametrize("order,named", [
    ("net = paddle.nn.Sequential(paddle.nn.Linear(2, 3), paddle.nn.Linear(3, 1))\nprocess.seed_everything(42)", True),
    ("process.seed_everything(42)\nnet = paddle.nn.Sequential(paddle.nn.Linear(2, 3), paddle.nn.Linear(3, 1))", False),
    ("paddle.seed(7)\nnet = paddle.nn.Linear(2, 3)\nprocess.seed_everything(42)", False),
    # seeded twice (setup(cfg) before the model, then fit()'s own setup): the first seed counts
    ("process.seed_everything(42)\nnet = paddle.nn.Linear(2, 3)\nprocess.seed_everything(42)", False),
])
def test_weights_made_before_the_first_seed_are_named(order, named, fresh_python):
    out, _ = fresh_python(BUILD + order + "\n" + SAID, ROOT)
    line = eval(out.strip())                 # noqa: S307  (the repr printed above)
    if not named:
        assert line == ""
        return
    assert line.startswith("the weights of Sequential (linear_0.w_0, linear_0.b_0, linear_1.w_0 and 1 more) "
                           "were made before paddle_dist seeded Paddle (train.seed=42)")
    assert line.endswith("call paddle_dist.setup(cfg), or paddle.seed(...), before building the model")
