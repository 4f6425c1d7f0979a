"""Batches of the user's making (trainer/grouping.py): train.group_by_length's batches and a
batch sampler of the user's own, dealt out by the data plan, the same steps at any world
size; a sampler that breaks the contract is refused in one line."""

import numpy as np
import paddle
import pytest

from paddle_dist.errors import ConfigError, DataError
from paddle_dist.trainer.grouping import LengthGrouped, lengths_of
from paddle_dist.trainer.sampling import DataPlan, PlannedBatchSampler

LENGTHS = np.random.RandomState(0).randint(1, 200, size=301).tolist()


def _epoch(grouped, epoch):
    grouped.set_epoch(epoch)
    return list(grouped)


def _padding(batches):
    return sum(max(LENGTHS[i] for i in b) * len(b) - sum(LENGTHS[i] for i in b) for b in batches)


def test_length_grouped_batches_cover_the_epoch_once_with_little_padding():
    grouped = LengthGrouped(LENGTHS, 8, shuffle=True, drop_last=False, seed=2024, window=10)
    first = _epoch(grouped, 0)
    assert sorted(i for b in first for i in b) == list(range(301)) and len(first) == len(grouped) == 38
    assert sorted(len(b) for b in first)[:2] == [5, 8]                      # one short batch
    assert _epoch(grouped, 0) == first and _epoch(grouped, 1) != first      # drawn from the epoch
    shuffled = np.random.RandomState(1).permutation(301).tolist()
    assert _padding(first) * 4 < _padding([shuffled[i:i + 8] for i in range(0, 301, 8)])
    dropped = LengthGrouped(LENGTHS, 8, shuffle=False, drop_last=True, seed=0)
    assert len(_epoch(dropped, 0)) == len(dropped) == 37 and all(len(b) == 8 for b in _epoch(dropped, 0))


class Own(paddle.io.BatchSampler):
    """A user's bucketing sampler: batches of 1 to 4 indices, drawn from the epoch."""

    def __init__(self, n, seeded=True):
        self.n, self.epoch, self.seeded = n, 0, seeded

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        rng = np.random.RandomState(self.epoch) if self.seeded else np.random
        order, at = rng.permutation(self.n).tolist(), 0
        for size in (1 + i % 4 for i in range(14)):
            yield order[at:at + size]
            at += size

    def __len__(self):
        return 14                    # 1+2+3+4 (x3) + 1+2: 33 indices


def _steps(batches, plan, world, epoch=2, agree=None):
    """Each optimizer step's micro-batches over `world` ranks (rank order)."""
    samplers = [PlannedBatchSampler(list(range(40)), 8, plan, r, world, True, False, batches, agree)
                for r in range(world)]
    for s in samplers:
        s.start(epoch)
    taken = [list(s) for s in samplers]
    share = plan.world * plan.accumulate // world
    return [sum((t[i * share:(i + 1) * share] for t in taken), []) for i in range(samplers[0].steps)]


@pytest.mark.parametrize("batches", [Own(33), LengthGrouped(LENGTHS[:40], 4, True, False, 7)])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_a_list_of_batches_is_dealt_the_same_every_step_at_any_world_size(batches, world):
    planned = _steps(batches, DataPlan(4, 1), 4)
    assert _steps(batches, DataPlan(4, 1), world) == planned
    # The plan's ranks take batches r, r + 4, ...; the list is padded with its first to a multiple of 4.
    listed = _epoch(batches, 2)
    padded = (listed * 2)[:-(-len(listed) // 4) * 4]
    assert [b for step in planned for b in step] == padded


def test_a_batch_sampler_that_differs_between_ranks_or_miscounts_is_refused_in_one_line():
    seen = []

    def agree(digest):           # the gather: rank 0's digest (the first asked), then this rank's
        seen.append(digest)
        return [seen[0], digest]

    with pytest.raises(ConfigError, match=r"gave the ranks different batches in epoch 3 .*rank 1's.*set_epoch"):
        for rank in range(2):     # each rank's own copy of an unseeded sampler
            PlannedBatchSampler(list(range(40)), 8, DataPlan(2, 1), rank, 2, True, False,
                                Own(33, seeded=False), agree).start(2)
    assert len(seen) == 2

    class Miscounted(Own):
        def __len__(self):
            return 20

    with pytest.raises(DataError, match="gave 14 batches in epoch 1, but its __len__ says 20"):
        _steps(Miscounted(33), DataPlan(1, 1), 1, epoch=0)


def test_lengths_are_the_datasets_own_or_its_samples_first_fields():
    class Sized(paddle.io.Dataset):
        def __getitem__(self, i):
            return {"ids": [0] * (i + 1), "label": 0}

        def __len__(self):
            return 3

    assert lengths_of(Sized()) == [1, 2, 3]
    Sized.lengths = lambda self: [5, 5]
    with pytest.raises(DataError, match="gave 2 lengths for 3 samples"):
        lengths_of(Sized())

    class Scalars(paddle.io.Dataset):
        def __getitem__(self, i):
            return 1.0, 0

        def __len__(self):
            return 2

    with pytest.raises(ConfigError, match="sample 0's first field is float.*lengths"):
        lengths_of(Scalars())
