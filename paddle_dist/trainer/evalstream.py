"""Evaluation of a stream: every sample of an IterableDataset evaluated once over all
ranks, in batches that do not depend on how many ranks read them.

The rule (docs/own_model.md, "Streams"):
- **Batches.** A stream that declares its shards (streams.sharded) is cut shard by shard:
  a shard's samples in order, `batch_size` at a time, its last batch shorter (no batch
  spans two shards). A stream without shards is one pass of `iter(dataset)` cut the same
  way. One process (one rank) evaluates these batches; so does every number of ranks, and
  each batch's numbers are the same bits wherever it is evaluated.
- **Dealing.** S shards over W ranks: with S >= W rank r reads shards r, r + W, ... and no
  other; with S < W shard j is read by the G ranks j, j + S, j + 2S, ..., and the g-th of
  them keeps that shard's batches g, g + G, ... (the others are read, not evaluated). So no
  rank reads more than its shards. Without shards every rank reads the whole pass and
  keeps batches r, r + W, ...: W readings of the stream (declare shards for a large set).
- **Workers.** A rank's DataLoader workers take its batches in turn (its t-th: worker
  t mod w), each reading the rank's share and collating only its own batches.
The ranks' batch counts differ, and are not known before the end: evaluation.py goes on
while any rank has a batch.

Example:
    batches = eval_loader(source, batch_size=32, rank=1, world=2, feed=feed)
    for inputs, labels in batches: ...          # rank 1's batches of the eval stream
"""

from __future__ import annotations

import itertools
import tempfile
from typing import Any, Iterator, List, Tuple

import paddle
from paddle.io.dataloader.collate import default_collate_fn

from ..errors import DataError
from .badsample import _note, collate_failure
from .feed import Feed
from .loading import NotedWorker, SplitLoader, to_tensors
from .streamplan import as_is
from .streams import _guarded, sharded

Batch = Tuple[List[str], List[Any]]      # the samples' names ("shard:index"), the samples


def share(shards: int, rank: int, world: int) -> Tuple[List[int], int, int]:
    """(the shards `rank` reads, g, G): of their batches it evaluates g, g + G, ...

    Example:
        share(5, 1, 2)     # ([1, 3], 0, 1): shards 1 and 3, every batch
        share(2, 3, 4)     # ([1], 1, 2): shard 1 with rank 1, batches 1, 3, 5, ...
    """
    if shards >= world or shards == 0:
        return list(range(rank, shards, world)), 0, 1
    shard = rank % shards
    return [shard], rank // shards, len(range(shard, world, shards))


def cut(items: Iterator[Tuple[str, Any]], batch_size: int) -> Iterator[Batch]:
    """(name, sample) pairs as batches of `batch_size`, the last one shorter."""
    while True:
        chunk = list(itertools.islice(items, batch_size))
        if not chunk:
            return
        yield [name for name, _ in chunk], [sample for _, sample in chunk]


def rank_batches(dataset, rank: int, world: int, batch_size: int) -> Iterator[Batch]:
    """The batches rank `rank` of `world` evaluates, in order (the module's rule)."""
    if not sharded(dataset):
        read = _guarded(lambda: iter(dataset), lambda i: f"sample {i} of the eval stream", dataset)
        yield from itertools.islice(cut(((f"0:{i}", s) for i, s in enumerate(read)), batch_size), rank, None, world)
        return
    names = list(dataset.shards())
    mine, first, every = share(len(names), rank, world)
    for j in mine:
        read = _guarded(lambda shard=names[j]: dataset.read_shard(shard),
                        lambda i, shard=names[j]: f"sample {i} of shard {shard!r}", dataset)
        batches = cut(((f"{j}:{i}", s) for i, s in enumerate(read)), batch_size)
        yield from itertools.islice(batches, first, None, every)


class RankBatches(paddle.io.IterableDataset):
    """Rank `rank`'s batches of the eval stream, collated; in a DataLoader worker, the
    worker's turns. `notes`: where a worker describes a failure (badsample.py)."""

    def __init__(self, dataset, rank: int, world: int, batch_size: int, collate_fn=None, notes: str = ""):
        self.dataset, self.rank, self.world, self.batch_size = dataset, rank, world, batch_size
        self.collate_fn, self.notes = collate_fn or default_collate_fn, notes

    def __iter__(self):
        info = paddle.io.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        batches = rank_batches(self.dataset, self.rank, self.world, self.batch_size)
        try:
            for names, samples in itertools.islice(batches, worker, None, workers):
                try:
                    collated = self.collate_fn(samples)
                except Exception as exc:
                    raise DataError(collate_failure(exc, samples, names, self.collate_fn)) from exc
                yield collated
        except DataError as exc:     # a worker's: Paddle shows only its queue killed
            if info is not None:
                _note(self.notes, str(exc))
            raise


def eval_loader(source, batch_size: int, rank: int, world: int, feed: Feed, workers: int = 0,
                job_dir: str = "") -> SplitLoader:
    """Rank `rank`'s batches of the stream `source` (a loading.Source) as (inputs, labels).
    `workers`: data.num_workers, unless the user's DataLoader had its own."""
    workers = workers if source.num_workers is None else source.num_workers
    if not workers:
        stream = RankBatches(source.dataset, rank, world, batch_size, source.collate_fn)
        return SplitLoader((to_tensors(batch) for batch in stream), feed)
    # A failing sample's description comes back from its worker through a file.
    notes = job_dir or tempfile.mkdtemp(prefix="paddle_dist-samples-")
    options = dict(source.options, worker_init_fn=NotedWorker(job_dir, source.options.get("worker_init_fn")))
    stream = RankBatches(source.dataset, rank, world, batch_size, source.collate_fn, notes)
    loader = paddle.io.DataLoader(stream, batch_size=None, collate_fn=as_is, num_workers=workers, **options)
    return SplitLoader(loader, feed, notes, own_folder=not job_dir)
