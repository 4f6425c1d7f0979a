"""Streams: how a paddle.io.IterableDataset is read, in shares, the same micro-batches at
every step on any number of ranks, from any position a checkpoint recorded.

The rule (docs/own_model.md, "Streams"):
- **Lanes.** A stream is read as L lanes. A dataset that declares its shards (`shards()`:
  a list of names, e.g. file paths, the same in every process; `read_shard(shard)`: that
  shard's samples, in order) has one lane per micro-batch of a step (L = W x k of the
  run's data plan, sampling.py): lane l reads shards l, l + L, l + 2L, ... in order, and
  again from its first in the next pass. A dataset without shards is one lane: the
  samples of `iter(dataset)`, pass after pass. Before a pass (of a shard, with shards)
  the dataset's `set_epoch(pass)` is called, if it has one.
- **Micro-batches.** A lane's samples, B (the per-rank batch size) at a time, are its
  micro-batches. Micro-batch n of the run (in plan order: step s has n = s*W*k ...
  (s+1)*W*k - 1) is micro-batch n // L of lane n % L; with shards, plan position p of
  every step is lane p. So the micro-batches do not depend on how many ranks or workers
  read them: a run continued on W' ranks deals them out as sampling.py deals a dataset's.
- **Identity and position.** A sample is named by (pass, shard, index in the shard) (shard
  0 without shards: the index in the pass). After each micro-batch a lane stands at a
  `LanePosition`: its pass, the shard among its own and the samples read of it (without
  shards: of the pass), and the dataset's own `state_dict()` when it has one and no shards.
  A checkpoint keeps every lane's position; a continued lane opens that shard and skips
  the samples read in it (without shards: `load_state_dict()` the state, or reads the
  pass up to the position). Nothing reads ahead of where the run stands.

Example:
    lane = lane_batches(dataset, lane=1, lanes=4, at=LanePosition(), batch_size=8)
    micro, ids, samples, after = next(lane)      # 0, [(0, 1, 0), ...], [...], LanePosition(micro=1, ...)
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import paddle

from ..errors import ConfigError, DataError
from .badsample import _note, collate_failure, describe

Identity = Tuple[int, int, int]      # (pass, shard, index in the shard or the pass)


def sharded(dataset) -> bool:
    """Whether `dataset` declares its shards (`shards()` and `read_shard(shard)`)."""
    return callable(getattr(dataset, "shards", None)) and callable(getattr(dataset, "read_shard", None))


def stateful(dataset) -> bool:
    """Whether `dataset` saves and loads its own position (`state_dict`, `load_state_dict`)."""
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def lane_count(dataset, world: int, accumulate: int) -> int:
    """The lanes a stream is read as under a plan of `world` ranks x `accumulate` micro-batches."""
    return world * accumulate if sharded(dataset) else 1


def check_shards(dataset, lanes: int) -> None:
    """Every lane needs a shard: one line saying how many there are and how to fix it."""
    if not sharded(dataset):
        return
    count = len(list(dataset.shards()))
    if count < lanes:
        raise ConfigError(f"the stream {type(dataset).__name__} has {count} shard(s), fewer than the {lanes} "
                          "micro-batches of a step, each read from shards of its own (docs/own_model.md, "
                          "Streams); split its data into at least that many shards, or run fewer ranks x "
                          "train.accumulate_steps")


@dataclass(frozen=True)
class LanePosition:
    """Where a lane stands: micro-batches given, the pass, the shard (its place among the
    lane's own) and the samples read of it (without shards: of the pass), and the
    dataset's own state there (without shards, when it has `state_dict`)."""

    micro: int = 0
    epoch: int = 0                 # the pass over the data
    shard: int = 0
    item: int = 0
    state: Any = None

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def of(cls, raw: Optional[Dict[str, Any]]) -> "LanePosition":
        return cls(**raw) if raw else cls()


def _set_epoch(dataset, epoch: int) -> None:
    if callable(getattr(dataset, "set_epoch", None)):
        dataset.set_epoch(epoch)


def lane_items(dataset, lane: int, lanes: int, at: LanePosition) -> Iterator[Tuple[Identity, Any, Tuple[int, int, int]]]:
    """(identity, sample, (pass, shard, items read) after it) of lane `lane` of `lanes`
    from `at` on, pass after pass, without end. A pass that gives no sample is an error."""
    if not sharded(dataset):
        yield from _whole(dataset, at)
        return
    shards = list(dataset.shards())[lane::lanes]
    epoch, first, skip, empty = at.epoch, at.shard, at.item, 0
    while empty < 2:             # a pass with none (a resumed one may start at its end)
        given = False
        for ordinal in range(first, len(shards)):
            _set_epoch(dataset, epoch)
            shard = shards[ordinal]
            read = _guarded(lambda: dataset.read_shard(shard), lambda i: f"sample {i} of shard {shard!r}", dataset)
            for index, sample in enumerate(read):
                if index >= skip:            # skipped within the shard only: read, not kept
                    given = True
                    yield (epoch, lane + ordinal * lanes, index), sample, (epoch, ordinal, index + 1)
            skip = 0
        epoch, first, empty = epoch + 1, 0, 0 if given else empty + 1
    raise DataError(f"the shards of lane {lane} of {type(dataset).__name__} ({shards[:3]}...) gave no "
                    "sample in a whole pass; give every shard samples, or fewer shards that are empty")


def _whole(dataset, at: LanePosition):
    """A stream without shards: iter(dataset) pass after pass, from `at`."""
    epoch, skip, state, empty = at.epoch, at.item, at.state, 0
    while empty < 2:
        _set_epoch(dataset, epoch)
        index = 0
        if state is not None:                # the dataset's own position: it resumes there
            dataset.load_state_dict(state)
            index, state = skip, None
        given = False
        for sample in _guarded(lambda: iter(dataset), lambda i: f"sample {index} of pass {epoch}", dataset):
            if index >= skip:
                given = True
                yield (epoch, 0, index), sample, (epoch, 0, index + 1)
            index += 1
        epoch, skip, empty = epoch + 1, 0, 0 if given else empty + 1
    raise DataError(f"the stream {type(dataset).__name__} gave no sample in a whole pass")


def _guarded(open_samples, where, dataset):
    """The samples `open_samples()` gives; a failure to read one is a DataError naming it
    (`where(index)`) and the user's line that raised."""
    index = 0
    try:
        for sample in open_samples():
            yield sample
            index += 1
    except Exception as exc:
        raise DataError(describe(exc, f"reading {where(index)} of {type(dataset).__name__}")) from exc


def lane_batches(dataset, lane: int, lanes: int, at: LanePosition, batch_size: int):
    """(micro-batch number in the lane, identities, samples, position after) of lane
    `lane`'s micro-batches from `at` on."""
    items = lane_items(dataset, lane, lanes, at)
    keeps_state = stateful(dataset) and not sharded(dataset)
    for micro in itertools.count(at.micro):
        chunk = list(itertools.islice(items, batch_size))
        epoch, shard, item = chunk[-1][2]
        after = LanePosition(micro + 1, epoch, shard, item, dataset.state_dict() if keeps_state else None)
        yield micro, [c[0] for c in chunk], [c[1] for c in chunk], after


@dataclass(frozen=True)
class Layout:
    """Which micro-batches this rank reads: the plan's ranks x micro-batches
    (`planned_world`, `accumulate`), this rank of `world`, read as `lanes` lanes."""

    planned_world: int
    accumulate: int
    rank: int
    world: int
    lanes: int

    @property
    def per_step(self) -> int:
        return self.planned_world * self.accumulate

    @property
    def share(self) -> int:
        """Micro-batches this rank takes in a step."""
        return self.per_step // self.world

    def sequence(self, first: int, last: int) -> Iterator[Tuple[int, int]]:
        """(lane, micro-batch in the lane) of this rank's micro-batches of steps first .. last - 1."""
        for step in range(first, last):
            for position in range(self.rank * self.share, (self.rank + 1) * self.share):
                n = step * self.per_step + position
                yield n % self.lanes, n // self.lanes

    def given(self, lane: int, steps: int) -> int:
        """Micro-batches lane `lane` has given after `steps` steps."""
        return len(range(lane, steps * self.per_step, self.lanes))

    def step_of(self, lane: int, micro: int) -> int:
        """The step (0-based) micro-batch `micro` of lane `lane` belongs to."""
        return (micro * self.lanes + lane) // self.per_step


class RankStream(paddle.io.IterableDataset):
    """This rank's micro-batches of steps `first` .. `last` - 1, collated, each with its
    record (JSON: lane, micro, identities, position after). In a DataLoader worker, it
    gives the worker's turns (batch i of the rank: worker i mod w, as Paddle deals a
    stream's batches) and reads only the lanes those are in."""

    def __init__(self, dataset, layout: Layout, first: int, last: int, positions: List[LanePosition],
                 batch_size: int, collate_fn, notes: str = ""):
        self.dataset, self.layout, self.first, self.last = dataset, layout, first, last
        self.positions, self.batch_size, self.collate_fn = positions, batch_size, collate_fn
        self.notes = notes          # where a worker describes a failure (badsample.py)

    def __iter__(self):
        info = paddle.io.get_worker_info()
        try:
            yield from self._batches(*((info.id, info.num_workers) if info is not None else (0, 1)))
        except DataError as exc:    # a worker's: Paddle shows only its queue killed
            if info is not None:
                _note(self.notes, str(exc))
            raise

    def _batches(self, worker: int, workers: int):
        lanes: Dict[int, Iterator] = {}
        for i, (lane, wanted) in enumerate(self.layout.sequence(self.first, self.last)):
            if i % workers != worker:
                continue
            if lane not in lanes:
                lanes[lane] = lane_batches(self.dataset, lane, self.layout.lanes, self.positions[lane],
                                           self.batch_size)
            for micro, ids, samples, after in lanes[lane]:      # others' micro-batches: dropped
                if micro >= wanted:
                    break
            if micro != wanted:
                raise RuntimeError(f"lane {lane} is at micro-batch {micro}, past {wanted}: its recorded "
                                   "position is ahead of the run's step; this is a bug in paddle_dist")
            # A string: Paddle's workers pass it through as it is.
            record = json.dumps({"lane": lane, "micro": micro, "ids": ids, "after": after.to_dict()})
            try:
                collated = self.collate_fn(samples)
            except Exception as exc:
                named = [f"{shard}:{index}" for _, shard, index in ids]      # shard:index
                raise DataError(collate_failure(exc, samples, named, self.collate_fn)) from exc
            yield collated, record
