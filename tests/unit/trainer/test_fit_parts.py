"""The pieces behind fit()'s batches, data loaders, metrics and moving averages."""

import numpy as np
import paddle
import pytest
from paddle.static import InputSpec

from paddle_dist.config import Config, derived, validate
from paddle_dist.errors import ConfigError, DataError
from paddle_dist.trainer.ema import Ema, warmed_decay
from paddle_dist.trainer.optim import MeasuredClip
from paddle_dist.trainer.evaluation import ExactShardSampler, accuracy_left_out, builtin_accuracy, zip_values
from paddle_dist.trainer.feed import Feed
from paddle_dist.trainer.loading import SampleLoader, Source
from paddle_dist.trainer.selection import Best


class TwoInputs(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(3, 2)

    def forward(self, ids, length, scale=1.0):
        return self.fc(ids) * length.unsqueeze(-1) * scale


def t(*shape, dtype="float32"):
    return paddle.ones(list(shape), dtype=dtype)


def test_a_tuple_batch_gives_forwards_arguments_without_default_then_the_labels():
    feed = Feed(TwoInputs())
    inputs, labels = feed.split([t(4, 3), t(4), t(4, 1, dtype="int64")])
    assert [list(x.shape) for x in inputs] == [[4, 3], [4]] and [list(y.shape) for y in labels] == [[4, 1]]


def test_counts_and_input_specs_set_the_split():
    assert len(Feed(paddle.nn.Linear(3, 2), inputs=2).split([t(2, 3), t(2, 3), t(2, 1)])[0]) == 2
    specs = [InputSpec([None, 3], "float32", "a")]
    inputs, labels = Feed(TwoInputs(), inputs=specs, labels=1).split([t(2, 3), t(2, 1), t(2, 5)])
    assert len(inputs) == 1 and [list(y.shape) for y in labels] == [[2, 1]]


def test_a_dict_batch_is_taken_by_forwards_names_and_the_other_keys_are_labels():
    feed = Feed(TwoInputs())
    batch = {"mask": t(2, 1), "length": t(2), "ids": t(2, 3)}
    inputs, labels = feed.split(batch)
    assert inputs[0] is batch["ids"] and inputs[1] is batch["length"] and labels == [batch["mask"]]


def test_a_dict_batch_by_input_spec_names_and_label_names():
    feed = Feed(paddle.nn.Linear(3, 2), inputs=[InputSpec([None, 3], name="image")],
                labels=[InputSpec([None], name="mask")])
    batch = {"image": t(2, 3), "mask": t(2), "weights": t(2)}
    assert feed.split(batch) == ([batch["image"]], [batch["mask"]])
    with pytest.raises(DataError, match="labels name"):
        Feed(paddle.nn.Linear(3, 2), inputs=[InputSpec([None, 3], name="image")],
             labels=[InputSpec([None], name="label")]).split({"image": t(2, 3)})


def test_a_dict_whose_keys_name_no_argument_is_split_in_sorted_key_order_as_hapi_flattens_it():
    inputs, labels = Feed(paddle.nn.Linear(3, 2)).split({"b": t(2, 1), "a": t(2, 3)})
    assert list(inputs[0].shape) == [2, 3] and list(labels[0].shape) == [2, 1]


def test_split_batch_and_a_too_short_batch():
    x = t(2, 3)
    assert Feed(paddle.nn.Linear(3, 2), split_batch=lambda b: (b["x"], None)).split({"x": x}) == ([x], [])
    with pytest.raises(DataError, match="takes 2 input"):
        Feed(TwoInputs()).split([t(2, 3)])
    with pytest.raises(DataError, match="split_batch must return"):
        Feed(TwoInputs(), split_batch=lambda b: b).split([t(2, 3)] * 3)


def test_a_model_with_its_own_loss_gets_the_labels_and_its_extra_outputs_go_to_the_metrics():
    class Own(paddle.nn.Layer):
        def forward(self, x, y):
            return {"loss": (x - y).pow(2).mean(), "pred": x}

    feed = Feed(Own(), inputs=1, model_loss=True)
    inputs, labels = feed.split([t(2, 3), t(2, 3) * 3])
    loss, _, outputs = feed.loss_and_outputs(Own(), None, inputs, labels)
    assert float(loss) == 4.0 and len(outputs) == 1
    # a training batch's (inputs, labels), as the check before epoch 1 found them
    assert feed.hapi_inputs((1, 1)) == 2      # paddle.Model hands the network the labels too
    with pytest.raises(DataError, match="no 'loss'"):
        feed.loss_of(None, [{"pred": t(1)}], [])


def test_a_dataloader_is_taken_apart_and_one_that_cannot_be_sharded_is_refused():
    data = paddle.io.TensorDataset([paddle.zeros([10, 3]), paddle.zeros([10, 1])])
    loader = paddle.io.DataLoader(data, batch_size=4, shuffle=True, drop_last=True, num_workers=2,
                                  collate_fn=lambda samples: samples)
    source = Source.of(loader, "train_data")
    assert (source.batch_size, source.shuffle, source.drop_last, source.num_workers) == (4, True, True, 2)
    assert source.dataset is data and source.collate_fn is loader.collate_fn

    class Mine(paddle.io.BatchSampler):
        pass

    own = Mine(data, batch_size=2)       # the user's batches, dealt out by the plan (grouping.py)
    assert Source.of(paddle.io.DataLoader(data, batch_sampler=own), "train_data").batch_sampler is own
    with pytest.raises(ConfigError, match="batch sampler .Mine."):
        Source.of(paddle.io.DataLoader(data, batch_sampler=own), "eval_data")

    class Endless(Mine):
        def __len__(self):
            raise TypeError("no length")

    with pytest.raises(ConfigError, match="Endless has no __len__"):
        Source.of(paddle.io.DataLoader(data, batch_sampler=Endless(data, batch_size=2)), "train_data")

    class Stream(paddle.io.IterableDataset):
        def __iter__(self):
            yield np.zeros(3)

    assert Source.of(Stream(), "train_data").stream         # read by streams.py's rule
    streamed = Source.of(paddle.io.DataLoader(Stream(), batch_size=3, num_workers=2), "train_data")
    assert (streamed.stream, streamed.batch_size, streamed.num_workers) == (True, 3, 2)
    with pytest.raises(ConfigError, match="eval_data=.... is an IterableDataset"):
        Source.of(Stream(), "eval_data")
    with pytest.raises(ConfigError, match="not object"):
        Source.of(object(), "eval_data")
    subset = paddle.io.BatchSampler(sampler=paddle.io.SubsetRandomSampler([0, 1, 2]), batch_size=2)
    with pytest.raises(ConfigError, match="SubsetRandomSampler"):
        Source.of(paddle.io.DataLoader(data, batch_sampler=subset), "train_data")
    with pytest.raises(ConfigError, match="batch_size=None"):
        Source.of(paddle.io.DataLoader(data, batch_size=None), "train_data")
    shuffled = paddle.io.BatchSampler(sampler=paddle.io.RandomSampler(data), batch_size=2)
    assert Source.of(paddle.io.DataLoader(data, batch_sampler=shuffled), "train_data").shuffle
    kept = Source.of(paddle.io.DataLoader(data, batch_size=2, num_workers=1, persistent_workers=True), "x")
    assert "persistent_workers" not in kept.options      # rebuilt each epoch: no worker outlives it


def test_the_check_before_epoch_1_leaves_every_random_generator_as_it_found_it():
    import random

    from paddle_dist.trainer.firstbatch import _kept

    net = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.BatchNorm1D(2))
    before = (random.random(), np.random.rand(), paddle.rand([1]).item())
    random.seed(1), np.random.seed(1), paddle.seed(1)
    expected = (random.random(), np.random.rand(), paddle.rand([1]).item())
    random.seed(1), np.random.seed(1), paddle.seed(1)
    stats = net[1]._mean.numpy().copy()
    with _kept(net):
        random.random(), np.random.rand(4), paddle.rand([3])
        net.train()
        net(paddle.rand([4, 2]) + 5)                    # moves BatchNorm's running mean
    assert (random.random(), np.random.rand(), paddle.rand([1]).item()) == expected != before
    np.testing.assert_array_equal(net[1]._mean.numpy(), stats)


def test_zero_workers_read_in_this_thread_and_a_failing_sample_says_which():
    class Bad(paddle.io.Dataset):
        def __getitem__(self, i):
            if i == 3:
                raise ValueError("broken file")
            return np.zeros(2, "float32"), np.int64(i)

        def __len__(self):
            return 6

    batches = SampleLoader(Bad(), [[0, 1], [2, 3]])
    first = next(iter(batches))
    assert isinstance(first[0], paddle.Tensor) and first[1].numpy().tolist() == [0, 1]
    with pytest.raises(DataError) as raised:
        list(batches)
    assert str(raised.value).startswith("reading sample 3 of Bad failed: ValueError: broken file (test_fit_parts.py:")
    assert isinstance(raised.value.__cause__, ValueError)


def test_exact_shards_take_as_many_exchange_rounds_as_rank_0_has_batches():
    shards = [ExactShardSampler(11, 2, rank, 4) for rank in range(4)]
    assert sorted(i for s in shards for batch in s for i in batch) == list(range(11))
    assert {s.rounds for s in shards} == {2} and [len(s) for s in shards] == [2, 2, 1, 1]
    assert [list(s) for s in shards[:2]] == [[[0, 1], [8, 9]], [[2, 3], [10]]]     # one process's batches, dealt out


def test_builtin_accuracy_only_for_classifier_outputs():
    assert builtin_accuracy([paddle.to_tensor([[0.1, 0.9], [0.8, 0.2]])], [paddle.to_tensor([[1], [1]])]) == 1
    assert builtin_accuracy([t(2, 2, 4, 4)], [t(2, 4, 4, dtype="int64")]) is None
    # One logit ([N, 1], BCEWithLogitsLoss): an argmax over one column names class 0 for every sample.
    assert builtin_accuracy([paddle.to_tensor([[2.0], [-2.0]])], [paddle.to_tensor([[1], [0]])]) is None


def test_one_column_of_scores_says_why_there_is_no_accuracy_and_two_do_not():
    line = accuracy_left_out([t(8, 1)], [t(8, 1, dtype="int64")])
    assert line.startswith("no built-in accuracy: the model's scores have one column (float32 [8, 1])")
    assert "metrics=" in line
    assert accuracy_left_out([t(8, 2)], [t(8, 1, dtype="int64")]) == ""
    assert accuracy_left_out([t(2, 2, 4, 4)], [t(2, 4, 4, dtype="int64")]) == ""     # not a classifier's


def test_metric_values_are_named_as_the_metric_names_them():
    accuracy = paddle.metric.Accuracy(topk=(1, 2))
    accuracy.update(np.array([[0, 1], [1, 0]], "float32"))       # hit 2nd, hit 1st
    assert zip_values(accuracy) == {"acc_top1": 0.5, "acc_top2": 1.0}
    single = paddle.metric.Accuracy()
    single.update(np.array([[1], [0]], "float32"))
    assert zip_values(single) == {"acc": 0.5}


def test_which_way_is_better():
    assert Best("eval_miou").higher_is_better and Best("eval_accuracy").higher_is_better
    assert not Best("eval_loss").higher_is_better and not Best("eval_error").higher_is_better


def test_monitor_and_ema_decay_are_checked():
    validate(derived(Config(), {"checkpoint.monitor": "eval_miou"}))
    with pytest.raises(ConfigError, match="eval_<metric>"):
        validate(derived(Config(), {"checkpoint.monitor": "miou"}))
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        validate(derived(Config(), {"train.ema_decay": 1.0}))


def test_moving_averages_follow_the_weights_and_are_applied_only_inside():
    paddle.seed(1)
    net = paddle.nn.Linear(2, 1)
    ema = Ema(net, 0.5, warmup=False)
    start = net.weight.numpy().copy()
    net.weight.set_value(paddle.to_tensor(start + 2.0))
    ema.update()
    np.testing.assert_allclose(ema.state()["weight"], start + 1.0, rtol=1e-6)
    with ema.applied():
        np.testing.assert_allclose(net.weight.numpy(), start + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(net.weight.numpy(), start + 2.0)
    again = Ema(net, 0.5)
    again.load(ema.state(), ema.updates)
    np.testing.assert_array_equal(again.state()["weight"], ema.state()["weight"])
    assert again.updates == 1
    assert set(ema.weights()) == set(net.state_dict())


def test_moving_averages_warm_up_as_the_suites_and_cover_batchnorm_statistics():
    """min(decay, (1 + n) / (10 + n)): the first update keeps 10 % of the start; the
    BatchNorm statistics are averaged like the weights (PaddleDetection's ModelEMA)."""
    assert warmed_decay(0.999, 0) == 0.1
    assert warmed_decay(0.999, 10 ** 6) == 0.999
    assert warmed_decay(0.999, 0, warmup=False) == 0.999
    paddle.seed(1)
    net = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.BatchNorm1D(2))
    ema = Ema(net, 0.99)
    assert "1._mean" in ema.shadow and "1._variance" in ema.shadow
    net.train()
    net(paddle.rand([8, 2]) + 5)                  # moves BatchNorm's running mean
    mean = net[1]._mean.numpy().copy()
    ema.update()
    np.testing.assert_allclose(ema.state()["1._mean"], 0.9 * mean, rtol=1e-6)   # 0.1 kept of 0


def test_the_measured_clip_keeps_the_norm_it_clipped():
    net = paddle.nn.Linear(2, 1, bias_attr=False)
    clip = MeasuredClip(0.1)
    opt = paddle.optimizer.SGD(0.0, parameters=net.parameters(), grad_clip=clip)
    net.weight.set_value(paddle.to_tensor([[3.0], [4.0]]))
    (net(paddle.to_tensor([[1.0, 0.0]])) * 0 + net.weight.sum()).backward()
    opt.step()
    assert abs(float(clip.last) - np.sqrt(2.0)) < 1e-5


def test_evaluation_runs_the_forward_under_o2s_autocast(monkeypatch):
    """O2 keeps 16-bit weights, which float32 inputs crash into (`operator < linear >
    error`): evaluate() (the loop's, hapi's and --eval-only's) runs the forward in the
    plan's autocast at O2; at O1 the weights are float32 and it evaluates in float32."""
    import contextlib
    from types import SimpleNamespace

    from paddle_dist.trainer import amp
    from paddle_dist.trainer.evaluation import EvalSetup, evaluate

    inside = []

    @contextlib.contextmanager
    def recorded(plan):
        inside.append(plan.level)
        yield
        inside.pop()

    seen = []

    class Net(paddle.nn.Linear):
        def forward(self, x):
            seen.append(list(inside))
            return super().forward(x)

    monkeypatch.setattr(amp, "autocast", recorded)
    data = paddle.io.TensorDataset([paddle.ones([5, 3]), paddle.zeros([5, 1], dtype="int64")])
    env = SimpleNamespace(global_rank=0, world_size=1, is_distributed=False, job_dir="")
    net = Net(3, 2)
    for level, want in (("O2", ["O2"]), ("O1", ["O0"])):
        seen.clear()
        found = evaluate(EvalSetup(net, Source.of(data, "eval_data"), Feed(net), paddle.nn.CrossEntropyLoss(),
                                   batch_size=2, amp=amp.AmpPlan(level, "bfloat16")), env)
        assert found["count"] == 5 and seen == [want] * 3


def test_bfloat16_losses_and_metric_outputs_are_read_as_values_not_bits():
    """On a GPU at bf16 O2 the loss and a metric's compute() results may be bfloat16
    tensors, whose .numpy() gives the bits (uint16): 1.2 would be logged as 16282."""
    from paddle_dist.trainer.feed import to_float
    from paddle_dist.trainer.evaluation import computed

    loss = paddle.to_tensor(1.2).astype("bfloat16")
    assert loss.numpy().dtype == np.uint16                # what Paddle hands out
    assert to_float(loss) == pytest.approx(1.2, abs=1e-2)

    class Scores(paddle.metric.Metric):
        def compute(self, pred, label):
            return pred.astype("bfloat16"), label

        def update(self, *args):
            pass

        def accumulate(self):
            return 0.0

        def reset(self):
            pass

        def name(self):
            return "scores"

    pred, label = computed(Scores(), [paddle.to_tensor([[0.25, 0.75]])], [paddle.to_tensor([[1]])])
    assert pred.dtype == np.float32 and pred.tolist() == [[0.25, 0.75]] and label.tolist() == [[1]]
