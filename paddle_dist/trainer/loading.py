"""Where a job's batches come from: a dataset, or a user's `paddle.io.DataLoader`, read
through paddle_dist's own sharded, resumable batch sampler.

A DataLoader given to fit() is taken apart: its dataset, batch size, `drop_last`,
shuffling, `collate_fn` and workers are kept, and a new DataLoader is built over the same
dataset with paddle_dist's sampler, so each rank reads its own shard and an epoch can
start part-way through (exact resume). A batch sampler of the user's own is kept as the
epoch's list of batches, which the data plan deals out (sampling.py); an IterableDataset
is a stream (streams.py; as an eval set, evalstream.py). A DataLoader whose order paddle_dist cannot shard (a sampler
that picks a subset, by weights or with replacement) is refused in one line at the call.

Example:
    source = Source.of(user_loader, "train_data")     # or a Dataset
    loader = source.loader(sampler, feed)             # yields (inputs, labels)
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

import numpy as np
import paddle
from paddle.io.dataloader.collate import default_collate_fn

from ..security import private
from ..errors import ConfigError, DataError
from .badsample import Guarded, GuardedCollate, collate_failure, describe, name_of, raise_noted
from . import streams
from .feed import Feed
from .sampling import SeededSamples

# The DataLoader settings carried over from a user's loader (besides its workers and collate).
# (Not persistent_workers: the loader is built anew each epoch, over a sampler that may
# skip part of it, and a persistent iterator's workers would outlive their shutdown.)
CARRIED = ("use_shared_memory", "timeout", "worker_init_fn", "prefetch_factor", "use_buffer_reader")
ORDERS = (paddle.io.SequenceSampler, paddle.io.RandomSampler)   # what a rank's shard can replace
SHARDABLE = (paddle.io.BatchSampler, paddle.io.DistributedBatchSampler)


@dataclass
class Source:
    """A dataset and how its samples become batches. `batch_size`, `drop_last` and
    `shuffle` are None unless a DataLoader set them (then they win over the config's)."""

    dataset: Any
    collate_fn: Optional[Callable] = None
    num_workers: Optional[int] = None
    batch_size: Optional[int] = None
    drop_last: Optional[bool] = None
    shuffle: Optional[bool] = None
    options: Dict[str, Any] = field(default_factory=dict)
    batch_sampler: Any = None          # a batch sampler of the user's own (its contract: _own_batches)

    @property
    def stream(self) -> bool:
        """Whether the data is an IterableDataset (read by streams.py's rule)."""
        return isinstance(self.dataset, paddle.io.IterableDataset)

    @classmethod
    def of(cls, data, what: str) -> Optional["Source"]:
        """A Source for fit()'s `train_data` or `eval_data` (a Dataset or a DataLoader)."""
        if data is None or isinstance(data, Source):
            return data
        if isinstance(data, paddle.io.DataLoader):
            return _with_samples(cls._from_loader(data, what), what)
        if isinstance(data, paddle.io.IterableDataset):
            return cls(data)
        if not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
            raise ConfigError(f"fit({what}=...) takes a paddle.io.Dataset or a paddle.io.DataLoader, "
                              f"not {type(data).__name__}")
        return _with_samples(cls(data), what)

    @classmethod
    def _from_loader(cls, loader, what: str) -> "Source":
        dataset, sampler = loader.dataset, loader.batch_sampler
        if sampler is None:
            raise ConfigError(f"fit({what}=...) is a DataLoader without a batch size "
                              "(batch_size=None); give it batch_size=N (per rank)")
        options = {k: getattr(loader, k) for k in CARRIED if hasattr(loader, k)}
        if isinstance(dataset, paddle.io.IterableDataset):
            return cls(dataset, collate_fn=loader.collate_fn,
                       num_workers=loader.num_workers, batch_size=sampler.batch_size,
                       drop_last=bool(loader.drop_last), options=options)
        if type(sampler) not in SHARDABLE:
            return cls(dataset, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                       options=options, batch_sampler=_own_batches(sampler, what))
        inner = getattr(sampler, "sampler", None)
        if isinstance(sampler, paddle.io.DistributedBatchSampler):
            shuffle = bool(sampler.shuffle)
        elif type(inner) in ORDERS and not getattr(inner, "replacement", False) \
                and getattr(inner, "_num_samples", None) is None:
            shuffle = isinstance(inner, paddle.io.RandomSampler)
        else:
            raise ConfigError(f"fit({what}=...) is a DataLoader whose sampler ({type(inner).__name__}) "
                              "picks samples paddle_dist's shards would not (a subset, weights, "
                              "replacement); give fit() the dataset you mean (e.g. paddle.io.Subset) "
                              "with shuffle=True or False")
        return cls(dataset, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                   batch_size=sampler.batch_size, drop_last=sampler.drop_last, shuffle=bool(shuffle),
                   options=options)

    def __len__(self) -> int:
        return 0 if self.stream else len(self.dataset)

    def loader(self, batch_sampler, feed: Feed, workers: int = 0, batched: bool = True,
               job_dir: str = ""):
        """Batches of `batch_sampler`'s indices, split by `feed` into (inputs, labels).
        `workers`: the config's data.num_workers, unless the user's DataLoader had its own;
        each notes its pid in `job_dir` (the launcher's, env.DistEnv.job_dir), whose
        launcher removes the shared memory of workers killed with their rank."""
        workers = workers if self.num_workers is None else self.num_workers
        if workers == 0 or self.gathers(batched):
            return SplitLoader(self._in_thread(batch_sampler, batched), feed)
        # A failing sample's description comes back from its worker through a file
        # (badsample.py): in the job's private directory, or one of the loader's own.
        folder = job_dir or tempfile.mkdtemp(prefix="paddle_dist-samples-")
        options = dict(self.options, worker_init_fn=NotedWorker(job_dir, self.options.get("worker_init_fn")))
        batches = paddle.io.DataLoader(Guarded(self.dataset, folder), batch_sampler=batch_sampler,
                                       collate_fn=GuardedCollate(self.collate_fn or default_collate_fn, folder),
                                       num_workers=workers, **options)
        return SplitLoader(batches, feed, folder, own_folder=not job_dir)

    def first_batch(self, indices, batched: bool = True):
        """The batch of `indices`, read and collated in this thread (the check before work);
        of a stream, its first len(indices) samples (of its first shard, if it has shards)."""
        if self.stream:      # a dataset with a position of its own is put back where it was
            kept = self.dataset.state_dict() if streams.stateful(self.dataset) else None
            samples = [sample for _, sample, _ in itertools.islice(
                streams.lane_items(self.dataset, 0, 1, streams.LanePosition()), len(indices))]
            if kept is not None:
                self.dataset.load_state_dict(kept)
            return to_tensors((self.collate_fn or default_collate_fn)(samples))
        return next(iter(self._in_thread([indices], batched)))

    def gathers(self, batched: bool) -> bool:
        """Whether batches are gathered by the dataset's own `batch(indices)` (BatchLoader)."""
        return batched and self.collate_fn is None and callable(getattr(self.dataset, "batch", None))

    def _in_thread(self, batch_sampler, batched: bool):
        if self.gathers(batched):
            return BatchLoader(self.dataset, batch_sampler)
        return SampleLoader(self.dataset, batch_sampler, self.collate_fn)


def _own_batches(sampler, what: str):
    """A batch sampler of the user's own, under the contract the data plan deals it by
    (docs/own_model.md): it gives the epoch's whole list of batches (lists of indices), the
    same on every rank and for every call in an epoch, set by `set_epoch(epoch)` when it
    has one; `__len__` is the count of batches."""
    if what == "eval_data":
        raise ConfigError(f"fit({what}=...) is a DataLoader with its own batch sampler "
                          f"({type(sampler).__name__}); evaluation reads every sample once by its own "
                          "batches: give the eval DataLoader batch_size= instead, or the dataset")
    try:
        len(sampler)
    except TypeError:
        raise ConfigError(f"fit({what}=...) is a DataLoader whose batch sampler {type(sampler).__name__} has no "
                          "__len__; give it one (the count of batches of an epoch): paddle_dist deals the "
                          "epoch's batches over the ranks and counts the steps from it") from None
    return sampler


def _with_samples(source: Source, what: str) -> Source:
    """`source`, unless it is an eval set without samples: its evaluation would say
    "0 on 0 samples" and choose the best checkpoint from that, silently.

    Example:
        _with_samples(Source(Nothing()), "eval_data")   # DataError: ... has no samples ...
    """
    if what == "eval_data" and not source.stream and len(source) == 0:
        raise DataError(f"fit({what}=...) has no samples ({name_of(source.dataset)}, len 0): its "
                        "evaluation would report 0 on 0 samples and pick the best checkpoint from that; "
                        f"give it a dataset with samples, or leave {what} out to train without evaluation")
    return source


class BatchLoader:
    """Batches of an in-memory dataset, each gathered by one `dataset.batch(indices)` call
    (one fancy-indexing op per array) instead of a `__getitem__` per sample and a collate.
    Any dataset offering `batch(indices) -> (x, y)` of numpy arrays can use it."""

    def __init__(self, dataset, batch_sampler):
        self.dataset, self.batch_sampler = dataset, batch_sampler

    def __iter__(self):
        for indices in self.batch_sampler:
            x, y = self.dataset.batch(indices)
            yield [paddle.to_tensor(x), paddle.to_tensor(y)]

    def __len__(self):
        return len(self.batch_sampler)


class NotedWorker:
    """A DataLoader's worker_init_fn: notes the worker in the job's directory
    (private.note_worker), then runs the user's own, if any."""

    def __init__(self, job_dir: str, inner: Optional[Callable] = None):
        self.job_dir, self.inner = job_dir, inner

    def __call__(self, worker_id: int) -> None:
        private.note_worker(self.job_dir)
        if self.inner is not None:
            self.inner(worker_id)


class SampleLoader:
    """Batches read sample by sample and collated in this process, for zero workers.
    (Paddle's DataLoader with num_workers=0 reads in a thread, and a sample that raises
    there leaves the iteration waiting forever: Paddle 2.6 to 3.3.) A sample that fails
    raises its own error, with a note naming its index."""

    def __init__(self, dataset, batch_sampler, collate_fn=None):
        self.dataset, self.batch_sampler = dataset, batch_sampler
        self.collate_fn = collate_fn or default_collate_fn

    def __iter__(self):
        # SeededSamples puts the global generators back once a batch, not once a sample.
        one_batch = self.dataset.one_batch if isinstance(self.dataset, SeededSamples) else contextlib.nullcontext
        for indices in self.batch_sampler:
            samples = []
            with one_batch():
                for i in indices:
                    try:
                        samples.append(self.dataset[i])
                    except Exception as exc:
                        raise DataError(describe(exc, f"reading sample {i} of {name_of(self.dataset)}")) from exc
            try:
                collated = self.collate_fn(samples)
            except Exception as exc:
                raise DataError(collate_failure(exc, samples, indices, self.collate_fn)) from exc
            yield to_tensors(collated)

    def __len__(self):
        return len(self.batch_sampler)


def to_tensors(value):
    """numpy arrays (in lists, tuples and dicts) as paddle tensors, as a DataLoader gives them."""
    if isinstance(value, np.ndarray):
        return paddle.to_tensor(value)
    if isinstance(value, dict):
        return {k: to_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_tensors(v) for v in value]
    return value


class SplitLoader:
    """A loader's batches as (inputs, labels) lists. `notes`: where its workers describe a
    sample that failed (badsample.py), raised in place of Paddle's own line; `own_folder`:
    that directory is the loader's, removed when it ends."""

    def __init__(self, batches, feed: Feed, notes: str = "", own_folder: bool = False):
        self.batches, self.feed, self.notes, self.own_folder = batches, feed, notes, own_folder

    def __iter__(self):
        batches = iter(self.batches)
        try:
            try:
                for batch in batches:
                    yield self.feed.split(batch)
            except (SystemError, RuntimeError) as exc:     # Paddle's, for a worker's failure
                raise_noted(self.notes, exc)
                raise
        finally:
            # A loop left early (the step limit, an early stop, an error) ends its DataLoader
            # workers now: left to the interpreter's exit, Paddle's handler takes their
            # ending for a crash (SystemError, exit 1).
            shutdown = getattr(batches, "_try_shutdown_all", None)
            if shutdown is not None:
                shutdown()
            if self.own_folder:
                shutil.rmtree(self.notes, ignore_errors=True)

    def __len__(self):
        return len(self.batches)
