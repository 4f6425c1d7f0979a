"""The data plan (trainer/sampling.py): at the plan's world size a rank gets Paddle's
DistributedBatchSampler's batches exactly; at another, the ranks together take each step's
same samples, and the world sizes that cannot share a step evenly are refused."""

import paddle
import pytest

from paddle_dist.errors import ConfigError
from paddle_dist.checkpoint import Meta
from paddle_dist.trainer.sampling import DataPlan, PlannedBatchSampler, SeededSamples, plan_for


class Indices(paddle.io.Dataset):
    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return i

    def __len__(self):
        return self.n


DATA = Indices(37)          # 4 per batch: uneven shards, padding and a short last batch


def _meta(world, accumulate=0):
    """A checkpoint's record of a run planned for `world` ranks (0: from before plans)."""
    return Meta.of({"global_step": 0, "epoch": 0, "step_in_epoch": 0, "world_size": world, "model": "",
                    "plan_accumulate": accumulate})


def _batches_at(world):
    return len(paddle.io.DistributedBatchSampler(DATA, 4, num_replicas=world, rank=0))


def _all(plan, world, epoch=3, done=0):
    samplers = [PlannedBatchSampler(DATA, 4, plan, rank, world, True, False) for rank in range(world)]
    for sampler in samplers:
        sampler.start(epoch, done)
    return samplers


@pytest.mark.parametrize("world, k", [(2, 1), (2, 2), (4, 1), (3, 2)])
def test_at_the_plans_world_size_a_rank_gets_paddles_batches(world, k):
    for rank, sampler in enumerate(_all(DataPlan(world, k), world)):
        paddles = paddle.io.DistributedBatchSampler(DATA, 4, num_replicas=world, rank=rank, shuffle=True)
        paddles.set_epoch(3)
        assert list(sampler) == list(paddles)


@pytest.mark.parametrize("plan, world", [(DataPlan(2, 1), 1), (DataPlan(4, 1), 2), (DataPlan(4, 1), 1),
                                         (DataPlan(3, 2), 6), (DataPlan(3, 2), 2)])
def test_on_another_world_size_the_same_samples_and_digests_every_step(plan, world):
    assert plan_for(_meta(plan.world, plan.accumulate), world, 1, _batches_at) == plan
    planned, moved = _all(plan, plan.world, done=1), _all(plan, world, done=1)
    assert sorted(i for s in moved for i in s) == sorted(i for s in planned for i in s)
    assert all(len(list(s)) == len(s) for s in moved)
    steps = range(planned[0].steps)
    assert [planned[0].step_digest(step) for step in steps] == [moved[0].step_digest(step) for step in steps]


def test_a_world_size_that_cannot_share_the_steps_is_refused_with_the_ones_that_can():
    with pytest.raises(ConfigError, match=r"3 ranks cannot share each step's 2 micro-batches .*continue "
                                          r"it on 1, 2 rank\(s\)"):
        plan_for(_meta(2), 3, 1, _batches_at)


def test_a_sample_draws_the_same_numbers_whoever_reads_it():
    import numpy as np

    class Noisy(paddle.io.Dataset):
        def __getitem__(self, i):
            return np.random.rand()

        def __len__(self):
            return 10

    one, two = SeededSamples(Noisy(), seed=7), SeededSamples(Noisy(), seed=7)
    one.set_epoch(2)
    two.set_epoch(2)
    before = np.random.get_state()[1].copy()
    assert [one[i] for i in range(10)] == [two[i] for i in reversed(range(10))][::-1]
    assert (np.random.get_state()[1] == before).all()          # this process's generator put back
    two.set_epoch(3)
    assert one[4] != two[4]


def test_a_batch_read_in_this_process_draws_as_its_samples_alone_and_puts_the_generators_back_once():
    """loading.SampleLoader (zero workers) reads a batch inside one_batch(): each sample
    still draws from its own seed, and Python's and numpy's generators are as before."""
    import random

    import numpy as np

    from paddle_dist.trainer.loading import SampleLoader

    class Noisy(paddle.io.Dataset):
        def __getitem__(self, i):
            return np.asarray([np.random.rand(), random.random()], dtype="float64")

        def __len__(self):
            return 10

    seeded = SeededSamples(Noisy(), seed=7)
    alone = [seeded[i] for i in (3, 9, 4, 0)]
    before = (random.getstate(), np.random.get_state()[1].copy())
    batches = [b.numpy() for b in SampleLoader(seeded, [[3, 9], [4, 0]])]
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()
    assert np.array_equal(np.concatenate(batches), np.stack(alone))
    assert not seeded._in_batch
