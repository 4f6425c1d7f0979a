"""The evaluation of a stream (trainer/evalstream.py): one process's batches, each evaluated
by one rank at any number of ranks, no rank reading shards that are not its own, workers
taking the rank's batches in turn, a sample that cannot be collated named."""

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_dist.errors import DataError
from paddle_dist.trainer.evalstream import RankBatches, eval_loader, rank_batches, share
from paddle_dist.trainer.feed import Feed
from paddle_dist.trainer.loading import Source

ROOT = Path(__file__).resolve().parents[3]


class Shards(paddle.io.IterableDataset):
    """Shards of the given sizes (one empty); counts which shards were opened."""

    def __init__(self, sizes=(7, 2, 0, 5, 3)):
        self.sizes, self.opened = list(sizes), Counter()

    def shards(self):
        return [f"part-{j}" for j in range(len(self.sizes))]

    def read_shard(self, shard):
        self.opened[shard] += 1
        j = int(shard.split("-")[1])
        for i in range(self.sizes[j]):
            yield np.array([j, i], "int64")

    def __iter__(self):
        for shard in self.shards():
            yield from self.read_shard(shard)


class Plain(paddle.io.IterableDataset):
    """A stream without shards: 11 samples."""

    def __iter__(self):
        for i in range(11):
            yield np.array([i], "int64")


def names(dataset, rank, world, batch_size=2):
    return [tuple(batch) for batch, _ in rank_batches(dataset, rank, world, batch_size)]


def test_shards_are_dealt_whole_or_shared_by_a_group_of_ranks():
    assert share(5, 1, 2) == ([1, 3], 0, 1)
    assert share(2, 3, 4) == ([1], 1, 2) and share(2, 2, 4) == ([0], 1, 2)
    assert share(2, 2, 5) == ([0], 1, 3) and share(2, 4, 5) == ([0], 2, 3) and share(2, 3, 5) == ([1], 1, 2)
    assert share(0, 1, 3) == ([], 0, 1)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7])
def test_every_batch_of_one_process_is_evaluated_by_one_rank_which_reads_only_its_shards(world):
    one = names(Shards(), 0, 1)
    assert one[:4] == [("0:0", "0:1"), ("0:2", "0:3"), ("0:4", "0:5"), ("0:6",)]     # no batch spans two shards
    dealt = []
    for rank in range(world):
        data = Shards()
        dealt += names(data, rank, world)
        shards, _, _ = share(5, rank, world)
        assert set(data.opened) == {f"part-{j}" for j in shards} and set(data.opened.values()) <= {1}
    assert sorted(dealt) == sorted(one)      # the same batches, each once


def test_a_stream_without_shards_is_read_whole_by_every_rank_which_keeps_its_batches():
    one = names(Plain(), 0, 1, 3)
    assert one == [("0:0", "0:1", "0:2"), ("0:3", "0:4", "0:5"), ("0:6", "0:7", "0:8"), ("0:9", "0:10")]
    for world in (2, 3, 5):
        assert [names(Plain(), rank, world, 3) for rank in range(world)] == [one[r::world] for r in range(world)]


ALONE = [[[2], [3]], [[6], [7]], [[10]]]          # rank 1 of 2, batches of 2


def workers_take_the_ranks_batches_in_turn(level: str):
    """`level` "paddle": Paddle's DataLoader with workers over RankBatches; "eval_loader":
    paddle_dist's, as evaluation builds it."""
    if level == "paddle":
        alone = [b.numpy().tolist() for b in paddle.io.DataLoader(RankBatches(Plain(), 1, 2, 2), batch_size=None)]
        assert alone == ALONE
        with_workers = paddle.io.DataLoader(RankBatches(Plain(), 1, 2, 2), batch_size=None, num_workers=2,
                                            collate_fn=lambda batch: batch)
        assert [np.asarray(b).tolist() for b in with_workers] == ALONE
    else:
        split = eval_loader(Source.of(Plain(), "eval_data"), 2, 1, 2, Feed(paddle.nn.Linear(1, 1)), workers=2)
        assert [inputs[0].numpy().tolist() for inputs, _ in split] == ALONE


@pytest.mark.parametrize("level", ["paddle", "eval_loader"])
def test_workers_take_the_ranks_batches_in_turn(fresh_python, level):
    # DataLoader workers are forked: in a fresh interpreter, never in a pytest-xdist worker,
    # whose threads may hold a lock at the fork (the forked worker then waits for ever); one
    # loader with workers per interpreter (a full run once hung 120 s with both in one).
    fresh_python("from tests.unit.trainer.test_evalstream import workers_take_the_ranks_batches_in_turn as t; "
                 f"t({level!r})", ROOT)


def test_the_loader_gives_inputs_and_labels_and_names_a_sample_it_cannot_collate():
    class Pairs(Shards):
        def read_shard(self, shard):
            for x in super().read_shard(shard):
                yield x.astype("float32"), x[:1]

    net = paddle.nn.Linear(2, 2)
    batches = list(eval_loader(Source.of(Pairs(), "eval_data"), 4, 1, 2, Feed(net)))
    assert [inputs[0].shape for inputs, _ in batches] == [[2, 2], [4, 2], [1, 2]]      # shards 1 and 3
    assert batches[0][1][0].numpy().tolist() == [[1], [1]]

    class Ragged(Shards):
        def read_shard(self, shard):
            for x in super().read_shard(shard):
                yield np.zeros(3 if list(x) == [3, 2] else 2, "float32")

    with pytest.raises(DataError, match="collating samples .*3:2"):
        list(itertools.islice(eval_loader(Source.of(Ragged(), "eval_data"), 4, 1, 2, Feed(net)), 3))
