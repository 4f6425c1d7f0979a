"""Batches made as a list for the whole epoch, which the data plan deals out (sampling.py):
`train.group_by_length` (`LengthGrouped`), or a batch sampler of the user's own.

train.group_by_length: samples of similar length in a batch, so that padding is short.
An epoch's batches: the samples in an order drawn from (train.seed, epoch) (their own
order with train.shuffle=false), cut into windows of WINDOW batches' samples; each window
sorted by length, longest first, and cut into batches of B; then the batches shuffled
(drawn alike). Every batch is full but the epoch's last one (dropped with
train.drop_last). The lengths are the dataset's `lengths()` when it has one, else the
length of each sample's first field (every sample read once, when training starts).

A batch sampler of the user's own follows the contract the plan needs (docs/own_model.md):
its iteration is the epoch's whole list of batches (lists of indices), the same on every
rank and at every call in the epoch, set by `set_epoch(epoch)`; `__len__` its count.

Example:
    grouped = LengthGrouped([5, 3, 9, 1], batch_size=2, shuffle=True, drop_last=False, seed=2024)
    grouped.set_epoch(0)
    list(grouped)           # e.g. [[2, 0], [1, 3]]: 9 and 5 together, 3 and 1 together
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from ..errors import ConfigError, DataError

WINDOW = 50          # batches' worth of samples sorted together: local enough to stay random


class LengthGrouped:
    """An epoch's batches of samples of similar length (module docstring)."""

    def __init__(self, lengths: Sequence[int], batch_size: int, shuffle: bool, drop_last: bool, seed: int,
                 window: int = WINDOW):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.window, self.epoch = int(seed), window, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return grouped_batches(len(self.lengths), self.batch_size, self.drop_last)

    def __iter__(self):
        rng = np.random.RandomState((self.seed * 1_000_003 + self.epoch) % 2**32)
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        size = self.window * self.batch_size
        batches: List[List[int]] = []
        for start in range(0, len(order), size):
            window = order[start:start + size]
            # Longest first; a stable sort keeps the drawn order among equal lengths.
            window = window[np.argsort(-self.lengths[window], kind="stable")]
            batches.extend(window[i:i + self.batch_size].tolist() for i in range(0, len(window), self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return iter(batches)


def grouped_batches(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches of an epoch under train.group_by_length."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


def lengths_of(dataset) -> List[int]:
    """Each sample's length: the dataset's `lengths()`, else the length of each sample's
    first field (a dict's first value), every sample read once."""
    if callable(getattr(dataset, "lengths", None)):
        found = [int(n) for n in dataset.lengths()]
        if len(found) != len(dataset):
            raise DataError(f"{type(dataset).__name__}.lengths() gave {len(found)} lengths for "
                            f"{len(dataset)} samples; give one per sample")
        return found
    return [_length(dataset[i], i) for i in range(len(dataset))]


def _length(sample, index: int) -> int:
    field = next(iter(sample.values())) if isinstance(sample, dict) else \
        sample[0] if isinstance(sample, (tuple, list)) else sample
    try:
        return len(field)
    except TypeError:
        raise ConfigError(f"train.group_by_length needs each sample's length: sample {index}'s first field is "
                          f"{type(field).__name__}, which has none; give the dataset a lengths() method "
                          "(one length per sample)") from None


class EpochBatches:
    """A batch sampler's list of batches of one epoch, made once per epoch (set_epoch
    first, when it has one) and checked against its `__len__`."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.epoch: Optional[int] = None
        self.made: List[List[int]] = []

    def __len__(self) -> int:
        return len(self.sampler)

    def of(self, epoch: int) -> List[List[int]]:
        if self.epoch != epoch:
            if callable(getattr(self.sampler, "set_epoch", None)):
                self.sampler.set_epoch(epoch)
            self.made, self.epoch = [[int(i) for i in batch] for batch in self.sampler], epoch
            if len(self.made) != len(self.sampler):
                raise DataError(f"the batch sampler {type(self.sampler).__name__} gave {len(self.made)} batches "
                                f"in epoch {epoch + 1}, but its __len__ says {len(self.sampler)}; make them agree "
                                "(paddle_dist counts the steps from __len__)")
        return self.made


class Dealt:
    """Plan rank `rank`'s batches of an epoch's list: batches rank, rank + W, rank + 2W, ...
    of the list, padded with its first batches to a multiple of W (drop_last: cut to
    one), as Paddle's DistributedBatchSampler deals samples."""

    def __init__(self, epochs: EpochBatches, world: int, rank: int, drop_last: bool):
        self.epochs, self.world, self.rank, self.drop_last = epochs, world, rank, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return dealt_batches(len(self.epochs), self.world, self.drop_last)

    def __iter__(self):
        made = self.epochs.of(self.epoch)
        total = len(self) * self.world
        padded = (made * (-(-total // len(made))))[:total] if made else []
        return iter(padded[self.rank::self.world])


def dealt_batches(batches: int, world: int, drop_last: bool) -> int:
    """Each of `world` ranks' batches of a list of `batches`."""
    return batches // world if drop_last else -(-batches // world)
