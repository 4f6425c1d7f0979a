"""The loss's own weighting (trainer/weighting.py): a loss with a count trains on Σ sums /
Σ counts over the step's micro-batches, a plain loss as before, bitwise; the count is no
part; the step's loss and the ledger's means weigh by the counts."""

import numpy as np
import paddle
import pytest

from paddle_dist.errors import DataError
from paddle_dist.runtime.env import DistEnv
from paddle_dist.sync.grad_sync import Rider
from paddle_dist.trainer.engine import joined, step
from paddle_dist.trainer.feed import Feed
from paddle_dist.trainer.keywords import Named
from paddle_dist.trainer.ledger import LossLedger
from paddle_dist.trainer.weighting import Weighting, counted_labels

VOCAB, IGNORE = 7, -100


class Tokens(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        paddle.seed(3)
        self.embed, self.head = paddle.nn.Embedding(VOCAB, 5), paddle.nn.Linear(5, VOCAB)

    def forward(self, ids):
        return self.head(paddle.tanh(self.embed(ids)))


def token_mean(logits, labels):
    """The token mean as users write it: Σ NLL over labels that are not IGNORE / their count."""
    nll = paddle.nn.functional.cross_entropy(logits, labels.unsqueeze(-1), ignore_index=IGNORE, reduction="none")
    count = (labels != IGNORE).astype("float32").sum()
    return {"loss": nll.sum() / count, "count": count}


def _batch(seed, length, pad):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (2, length))
    labels = rng.integers(0, VOCAB, (2, length))
    labels[:, length - pad:] = IGNORE
    return [paddle.to_tensor(ids)], [paddle.to_tensor(labels)]


def _grads(net):
    return {n: p.grad.numpy().copy() for n, p in net.named_parameters()}


def test_a_counted_loss_trains_on_the_token_mean_of_the_union_of_its_micro_batches():
    group = [_batch(1, 6, 4), _batch(2, 3, 0)]      # 4 tokens and 6 tokens
    net, captured = Tokens(), {}      # without an Engine: this process's count, before `average`
    opt = paddle.optimizer.SGD(0.0, parameters=net.parameters())
    result = step(net, token_mean, group, opt, feed=Feed(net, inputs=1),
                  average=lambda: captured.update(_grads(net)))
    # One process on the union, with the token mean: Σ NLL / Σ counts, one backward per batch.
    ref = Tokens()
    nll = [token_mean(ref(x[0]), y[0]) for x, y in group]
    total = sum(float(d["count"]) for d in nll)
    (paddle.add_n([d["loss"] * d["count"] for d in nll]) / total).backward()
    for name, value in _grads(ref).items():
        np.testing.assert_allclose(captured[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    assert float(result.count) == total == 10.0
    assert float(result.loss) == pytest.approx(sum(float(d["loss"] * d["count"]) for d in nll) / total, rel=1e-6)
    mean_of_means = sum(float(d["loss"]) for d in nll) / 2
    assert abs(float(result.loss) - mean_of_means) > 1e-4        # what was trained before


def test_the_gradient_the_optimizer_sees_is_the_token_means():
    group = [_batch(1, 6, 4), _batch(2, 3, 0)]
    net, seen = Tokens(), {}

    class Recording(paddle.optimizer.SGD):
        def step(self):
            seen.update(_grads(net))
            super().step()

    step(net, token_mean, group, Recording(0.1, parameters=net.parameters()), feed=Feed(net, inputs=1))
    ref = Tokens()
    nll = [token_mean(ref(x[0]), y[0]) for x, y in group]
    (paddle.add_n([d["loss"] * d["count"] for d in nll]) / 10.0).backward()
    for name, value in _grads(ref).items():
        np.testing.assert_allclose(seen[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_a_plain_loss_steps_as_before_bitwise():
    group = [_batch(1, 4, 0), _batch(2, 4, 0)]
    plain = lambda logits, labels: paddle.nn.functional.cross_entropy(logits, labels.unsqueeze(-1))  # noqa: E731
    net, seen = Tokens(), {}
    step(net, plain, group, paddle.optimizer.SGD(0.0, parameters=net.parameters()), feed=Feed(net, inputs=1),
         average=lambda: seen.update(_grads(net)))
    ref = Tokens()
    for x, y in group:
        (plain(ref(x[0]), y[0]) / 2).backward()
    for name, value in _grads(ref).items():
        assert np.array_equal(seen[name], value), name


def test_the_count_is_no_part_and_labels_can_be_counted():
    net = Tokens()
    feed = Feed(net, inputs=1)
    (x,), (y,) = _batch(1, 6, 4)
    loss, parts, count = feed.counted_loss(token_mean, [net(x)], [y])
    assert parts == {} and float(count) == 4.0
    mean = lambda logits, labels: token_mean(logits, labels)["loss"]  # noqa: E731
    loss, parts, count = feed.counted_loss(mean, [net(x)], [y], IGNORE)
    assert parts == {} and int(count) == 4
    assert feed.counted_loss(mean, [net(x)], [y])[2] is None
    assert int(counted_labels([], [paddle.to_tensor([[5, 7, IGNORE]])], IGNORE)) == 2
    named = Named([x, paddle.to_tensor([[IGNORE, 1]])], ["input_ids", "labels"])    # a model's own loss takes them
    assert int(counted_labels(named, [], IGNORE)) == 1
    with pytest.raises(DataError, match="no labels to count"):
        counted_labels([x], [], IGNORE)


def test_a_model_with_its_own_loss_gives_its_count_and_the_metrics_never_see_it():
    class Own(paddle.nn.Layer):
        def forward(self, x, y):
            return {"loss": x.mean(), "count": paddle.to_tensor(3.0), "loss_aux": x.sum(), "logits": x}

    feed = Feed(Own(), inputs=1, model_loss=True)
    x = paddle.ones([2, 2])
    loss, outputs, count = feed.evaluated(Own(), None, [x], [x])
    assert float(count) == 3.0 and [list(o.shape) for o in outputs] == [[], [2, 2]]     # loss_aux, logits
    assert set(feed.counted_loss(None, [Own()(x, x)], [])[1]) == {"loss_aux"}


def test_losses_with_and_without_counts_in_one_step_are_refused():
    weighting = Weighting(DistEnv())
    weighting.add(paddle.to_tensor(1.0), None)
    with pytest.raises(DataError, match="count for some batches"):
        weighting.add(paddle.to_tensor(1.0), 3)


def test_joined_riders_hand_each_its_own_values():
    got = {}
    a = Rider(2, lambda: np.array([1, 2], np.float32), lambda mean: got.update(a=mean))
    b = Rider(1, lambda: np.array([3], np.float32), lambda mean: got.update(b=mean))
    rider = joined([a, None, b])
    assert rider.size == 3 and rider.give().tolist() == [1, 2, 3]
    rider.take(np.array([4, 5, 6], np.float32))
    assert got["a"].tolist() == [4, 5] and got["b"].tolist() == [6]
    rider.take(None)
    assert got == {"a": None, "b": None}
    assert joined([None, a]) is a and joined([None]) is None


def test_the_ledger_weighs_steps_by_their_counts():
    ledger = LossLedger()
    ledger.begin_epoch()
    ledger.record(paddle.to_tensor(2.0, "float64"), {}, paddle.to_tensor(100.0, "float64"))
    ledger.record(4.0, {}, 300)
    assert ledger.mean_from(0) == pytest.approx((200 + 1200) / 400)
    assert ledger.epoch_totals()[:2] == (1400.0, 400.0)
    plain = LossLedger()
    plain.record(2.0, {})
    plain.record(4.0, {})
    assert plain.mean_from(0) == 3.0 and plain.epoch_totals()[:2] == (6.0, 2.0) and not plain.counted


def test_a_plain_loss_adds_no_collective_per_step_and_its_reports_take_the_ranks_mean(monkeypatch):
    """Without a rider to carry it (modes overlap, dataparallel, the backend's buckets), a
    plain loss's step loss stays the rank's: no all-reduce per step; the progress line's
    window is averaged over the ranks at its reports only (Progress.over_ranks)."""
    from paddle_dist.runtime.env import DistEnv
    from paddle_dist.trainer import weighting as module
    from paddle_dist.trainer.ledger import LossLedger

    called = []
    monkeypatch.setattr(module, "collective", lambda *a, **k: called.append(a))
    w = module.Weighting(DistEnv(world_size=2, global_rank=0))
    w.rider([])
    w.add(paddle.to_tensor(0.5), None)
    w.take(None)
    assert called == [] and w.local and float(w.loss) == 0.5 and w.count is None
    counted = module.Weighting(DistEnv(world_size=2, global_rank=0))
    counted.rider([])
    counted.add(paddle.to_tensor(0.5), 4)
    counted.take(None)
    assert len(called) == 1 and not counted.local          # a count is needed to train: exchanged
    ledger = LossLedger()
    ledger.record(0.5, {}, None, local=True)
    assert ledger.local_from(0) and not LossLedger().local_from(0)
