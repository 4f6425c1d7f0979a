"""Exact evaluation (trainer/evaluation.py): shards, streams at any number of ranks, the built-in
accuracy, metric names, autocast, values not bits."""

import numpy as np
import paddle
import pytest

from paddle_dist.trainer.evaluation import ExactShardSampler, accuracy_left_out, builtin_accuracy, zip_values
from paddle_dist.trainer.feed import Feed
from paddle_dist.trainer.loading import Source


def t(*shape, dtype="float32"):
    return paddle.ones(list(shape), dtype=dtype)


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


def test_a_stream_is_evaluated_as_one_process_evaluates_it_at_any_number_of_ranks(monkeypatch):
    """Ranks in threads, their collectives a barrier: uneven shards (one empty) leave ranks
    with fewer batches, or none, which still join the metrics' exchange until no rank has
    a batch; the loss, the built-in accuracy and a Metric are one process's."""
    import threading
    from types import SimpleNamespace

    from paddle_dist.trainer import evaluation
    from paddle_dist.trainer.evaluation import EvalSetup, evaluate

    class Shards(paddle.io.IterableDataset):
        def shards(self):
            return ["a", "b", "c", "d"]

        def read_shard(self, shard):
            rng = np.random.RandomState(ord(shard))
            for _ in range({"a": 7, "b": 2, "c": 0, "d": 5}[shard]):
                yield rng.randn(3).astype("float32"), np.array([rng.randint(2)], "int64")

    def run(world, metrics):
        slots, barrier, found = [None] * world, threading.Barrier(world), [None] * world

        def gather(obj, env, phase=None):
            slots[env.global_rank] = obj
            barrier.wait()
            every = list(slots)
            barrier.wait()
            return every

        monkeypatch.setattr(evaluation, "gather", gather)
        monkeypatch.setattr(evaluation, "all_reduce_sum", lambda values, env, phase=None: np.sum(
            gather(np.asarray(values, "float64"), env), axis=0))

        def rank(r):
            env = SimpleNamespace(global_rank=r, world_size=world, is_distributed=True, job_dir="")
            found[r] = evaluate(EvalSetup(net, Source.of(Shards(), "eval_data"), Feed(net),
                                          paddle.nn.CrossEntropyLoss(), [m() for m in metrics], batch_size=2), env)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        return found

    paddle.seed(0)
    net = paddle.nn.Linear(3, 2)
    for metrics in ((), (paddle.metric.Accuracy,)):
        want = run(1, metrics)[0]
        assert want["count"] == 14
        for world in (2, 3, 4, 5):
            assert run(world, metrics) == [want] * world, (world, metrics)


def test_a_stream_without_samples_is_said_in_one_line():
    from types import SimpleNamespace

    from paddle_dist.errors import DataError
    from paddle_dist.trainer.evaluation import EvalSetup, evaluate

    class Nothing(paddle.io.IterableDataset):
        def __iter__(self):
            return iter(())

    net = paddle.nn.Linear(3, 2)
    env = SimpleNamespace(global_rank=0, world_size=1, is_distributed=False, job_dir="")
    with pytest.raises(DataError, match=r"eval_data=\.\.\.\) gave no samples \(Nothing, a stream\)"):
        evaluate(EvalSetup(net, Source.of(Nothing(), "eval_data"), Feed(net), paddle.nn.CrossEntropyLoss()), env)
