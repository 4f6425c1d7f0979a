"""Streams (trainer/streams.py, streamplan.py): the same micro-batches at every step on any
number of ranks and workers, a continued stream from its lanes' positions exactly, and a
reader that opens only its own lanes' shards."""

import copy
import json
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_dist import config as configlib
from paddle_dist.checkpoint import Meta
from paddle_dist.errors import ConfigError, DataError
from paddle_dist.trainer.loading import Source
from paddle_dist.trainer.sampling import check_data
from paddle_dist.trainer.streamplan import StreamBatches, StreamSampler, positions_of
from paddle_dist.trainer.streams import LanePosition, Layout, check_shards, lane_count, lane_items

BATCH = 2

ROOT = Path(__file__).resolve().parents[3]


class Shards(paddle.io.IterableDataset):
    """Shard k: samples k*100, k*100 + 1, ... (3 + k of them); notes each shard it opens."""

    def __init__(self, count=6):
        self.count, self.opened = count, []

    def shards(self):
        return [f"s{k}" for k in range(self.count)]

    def read_shard(self, shard):
        self.opened.append(shard)
        k = int(shard[1:])
        for i in range(3 + k):
            yield np.array([k * 100 + i], dtype="int64")

    def __iter__(self):
        for shard in self.shards():
            yield from self.read_shard(shard)


class Counting(paddle.io.IterableDataset):
    """A stream without shards: 0, 1, ..., 10, with its own position (state_dict)."""

    def __init__(self, stateful=True):
        self.start, self.iterated = 0, 0
        if not stateful:
            self.state_dict = None

    def __iter__(self):
        for i in range(self.start, 11):
            self.iterated += 1
            self.start = i + 1
            yield np.array([i], dtype="int64")
        self.start = 0

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


def _source(dataset):
    return Source.of(dataset, "train_data")


def _read(dataset, plan=(2, 2), world=2, first=0, last=5, positions=None, workers=0):
    """Each step's samples as the ranks read them (rank order), and the samplers. Each rank
    reads a copy of `dataset` as it is now, as ranks in processes of their own do."""
    lanes = lane_count(dataset, *plan)
    samplers, per_rank, pristine = [], [], copy.deepcopy(dataset)
    for rank in range(world):
        dataset = dataset if rank == 0 else copy.deepcopy(pristine)
        sampler = StreamSampler(Layout(plan[0], plan[1], rank, world, lanes), last,
                                positions or [LanePosition()] * lanes, lambda mine: [mine], log=True)
        sampler.start(0, first)
        per_rank.append([b[:, 0].tolist() for b in StreamBatches(_source(dataset), sampler, BATCH, workers)])
        samplers.append(sampler)
    share = sampler.layout.share
    steps = [sum((r[s * share:(s + 1) * share] for r in per_rank), []) for s in range(last - first)]
    return steps, samplers


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_step_has_the_same_micro_batches_at_any_world_size(world):
    planned, _ = _read(Shards(), world=2)
    assert _read(Shards(), world=world)[0] == planned
    # Plan position p of every step is lane p (shards p, p + 4, ...), wrapping into a next pass.
    assert [step[0] for step in planned] == [[0, 1], [2, 400], [401, 402], [403, 404], [405, 406]]
    assert planned[2][2] == [204, 200]          # lane 2: shard 2 alone, 5 samples a pass


def test_workers_read_the_same_micro_batches(fresh_python):
    # DataLoader workers are forked: in a fresh interpreter, never in a pytest-xdist worker,
    # whose threads may hold a lock at the fork (the forked worker then waits for ever).
    fresh_python("from tests.unit.trainer.test_streams import Shards, _read\n"
                 "assert _read(Shards(), world=1, workers=2)[0] == _read(Shards(), world=2)[0]", ROOT)


def test_a_reader_opens_only_its_own_lanes_shards():
    for rank in range(4):                        # 4 ranks, one lane each: shards rank, rank + 4
        dataset = Shards(8)
        sampler = StreamSampler(Layout(2, 2, rank, 4, 4), 5, [LanePosition()] * 4, lambda mine: [mine])
        list(StreamBatches(_source(dataset), sampler, BATCH, 0))
        assert dataset.opened == [f"s{rank}", f"s{rank + 4}"]


def test_a_stream_continues_from_its_lanes_positions_skipping_within_the_shard():
    whole, _ = _read(Shards(), world=1, last=6)
    _, samplers = _read(Shards(), world=2, last=4)
    saved = _merged(samplers, 4)
    assert saved["lanes"] == 4 and [p["micro"] for p in saved["positions"]] == [4, 4, 4, 4]
    meta = Meta.of({"global_step": 4, "epoch": 0, "step_in_epoch": 4, "world_size": 2, "model": "m",
                    "stream": saved})
    dataset = Shards()
    continued, _ = _read(dataset, world=1, first=4, last=6, positions=positions_of(Meta.of(meta.to_dict()), 4))
    assert continued == whole[4:]
    assert dataset.opened[:4] == ["s4", "s5", "s2", "s3"]     # each lane opens the shard it stood in
    # Without positions (a checkpoint from before them), the lanes are read up to the step: the same.
    assert _read(Shards(), world=1, first=4, last=6, positions=positions_of(None, 4))[0] == whole[4:]


def _merged(samplers, steps):
    """The checkpoint's positions of several ranks' samplers (their gather, by hand)."""
    mine = [{lane: at.to_dict() for lane, at in s.reached.items()} for s in samplers]
    return StreamSampler(samplers[0].layout, 0, samplers[0].positions, lambda _: mine).position(steps)


def test_a_stream_without_shards_is_one_lane_and_resumes_by_its_own_state():
    whole, samplers = _read(Counting(), world=1, last=4)
    flat = [x for step in whole for batch in step for x in batch]
    assert flat == [i % 11 for i in range(32)]       # 11 a pass, pass after pass
    _, two = _read(Counting(), world=2, last=2)
    saved = _merged(two, 2)
    assert saved["positions"][0]["state"] == {"start": 5} and saved["positions"][0]["epoch"] == 1
    dataset = Counting()
    continued, _ = _read(dataset, world=2, first=2, last=4, positions=[LanePosition.of(saved["positions"][0])])
    assert continued == whole[2:]
    assert dataset.iterated == 12       # from item 5 of pass 1 (its state) to 27: not the 16 before
    # No state of its own: the pass is read again up to the position.
    plain = Counting(stateful=False)
    assert _read(plain, world=1, first=2, last=4, positions=positions_of(None, 1))[0] == whole[2:]


def test_the_step_digests_are_the_same_at_any_world_size():
    digests = []
    for world in (1, 2, 4):
        _, samplers = _read(Shards(), world=world, last=3)
        ids = [[i for s in samplers for i in s.ids.get(step, [])] for step in range(3)]
        digests.append([StreamSampler(samplers[0].layout, 3, [], lambda _: [ids[step]]).step_digest(step)
                        for step in range(3)])
    assert digests[0] == digests[1] == digests[2] and len(set(digests[0])) == 3


def test_a_batch_out_of_turn_and_a_lane_behind_its_step_are_bugs_said_so():
    sampler = StreamSampler(Layout(2, 1, 0, 1, 2), 3, [LanePosition()] * 2, lambda m: [m])
    record = json.dumps({"lane": 1, "micro": 0, "ids": [], "after": {"micro": 1}})
    with pytest.raises(RuntimeError, match="out of turn"):
        sampler.note(record, (0, 0))
    with pytest.raises(RuntimeError, match=r"lanes \[0, 1\] do not stand at step 1"):
        sampler.position(1)


def test_too_few_shards_an_empty_stream_and_a_stream_without_max_steps_are_one_line():
    with pytest.raises(ConfigError, match="has 2 shard.s., fewer than the 4 micro-batches of a step"):
        check_shards(Shards(2), 4)

    class Empty(Counting):
        def __iter__(self):
            return iter(())

    with pytest.raises(DataError, match="gave no sample in a whole pass"):
        next(lane_items(Empty(), 0, 1, LanePosition()))
    cfg = configlib.with_overrides([])
    with pytest.raises(ConfigError, match="set the run's optimizer steps, e.g. -o train.max_steps=1000"):
        check_data(_source(Counting()), cfg)
    grouped = configlib.with_overrides(["train.max_steps=4", "train.group_by_length=true"])
    with pytest.raises(ConfigError, match="group_by_length makes the batches, but the training data is a stream"):
        check_data(_source(Counting()), grouped)


def test_a_sample_that_cannot_be_read_or_collated_names_itself():
    class Broken(Shards):
        def read_shard(self, shard):
            for i, sample in enumerate(super().read_shard(shard)):
                if (shard, i) == ("s1", 2):
                    raise ValueError("not text")
                yield sample

    with pytest.raises(DataError, match=r"reading sample 2 of shard 's1' of Broken failed: ValueError: not text "
                                        r"\(test_streams.py:\d+, in read_shard\)"):
        _read(Broken(), world=1, last=3)

    def ragged(samples):
        return np.stack([np.zeros(len(samples) + int(s[0]) % 2) for s in samples])

    with pytest.raises(DataError, match=r"collating samples 0:0, 0:1 with ragged failed: ValueError"):
        list(StreamBatches(Source(Shards(), collate_fn=ragged), StreamSampler(
            Layout(1, 1, 0, 1, 1), 1, [LanePosition()], lambda m: [m]), BATCH, 0))
