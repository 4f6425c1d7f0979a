"""The losses of a run's steps, as the Session keeps them: each step's mean loss, its
parts and its count (the loss's, over every rank: tokens), read on the host only when
asked for (on a GPU every read waits for the queued work, so a read per step would stall
the device every step).

The Session records every step and reads the epoch's losses at the epoch's end and at a
mid-epoch checkpoint; the progress line reads the steps since its last report. A mean over
steps weighs each by its count for a loss with one (Σ sums / Σ counts: weighting.py), else
each step alike.

Example:
    ledger = LossLedger()
    ledger.begin_epoch()
    ledger.record(loss_tensor, {"loss_cls": part})
    ledger.epoch_losses()            # [0.6931...]: one host read for every unread loss
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .progress import read_values


class LossLedger:
    """This run's step losses and their parts (module docstring)."""

    def __init__(self):
        self._read: List[float] = []          # losses of this run's steps, read so far
        self._pending: list = []              # losses of the steps after those, not read yet
        self._parts: List[Dict[str, Any]] = []   # each step's loss parts (unread tensors or numbers)
        self._counts: list = []               # each step's count over every rank, or None
        self._local: List[bool] = []          # each step's loss is one rank's (weighting.py)
        self._epoch_from = 0                  # this run's steps before the epoch in progress

    def record(self, loss, parts: Dict[str, Any], count=None, local: bool = False) -> None:
        """A step's mean loss (a device tensor, left unread, or a number), its parts and
        its count over every rank (likewise; None for a loss without one); `local`: the
        loss is this rank's alone (a plain loss: the report takes the ranks' mean)."""
        self._pending.append(loss)
        self._parts.append(parts or {})
        self._counts.append(count)
        self._local.append(local)

    def local_from(self, start: int) -> bool:
        """Whether a step's loss from number `start` on is one rank's alone."""
        return any(self._local[start:])

    def counted_from(self, start: int) -> Optional[float]:
        """The sum of the counts of this run's steps from number `start` on (one host read),
        or None when the loss has no count."""
        counts = [c for c in self._counts[start:] if c is not None]
        return sum(read_values(counts)) if counts else None

    def begin_epoch(self) -> None:
        self._epoch_from = len(self)

    def __len__(self) -> int:
        return len(self._read) + len(self._pending)

    @property
    def losses(self) -> List[float]:
        """This run's loss per step so far, as floats (one host read for the unread ones)."""
        if self._pending:
            self._read += read_values(self._pending)
            self._pending = []
        return self._read

    def losses_from(self, start: int) -> List[float]:
        """The losses of this run's steps from number `start` (0-based) on."""
        return self.losses[start:]

    def parts_from(self, start: int) -> Dict[str, List[float]]:
        """The loss parts of this run's steps from number `start` on, by name, as floats."""
        steps = self._parts[start:]
        names = sorted({name for step in steps for name in step})
        values = read_values([step.get(name, 0.0) for step in steps for name in names])
        return {name: values[i::len(names)] for i, name in enumerate(names)}

    def epoch_losses(self) -> List[float]:
        """The losses of this run's steps in the epoch in progress."""
        return self.losses_from(self._epoch_from)

    def epoch_parts(self) -> Dict[str, List[float]]:
        """Their parts, by name."""
        return self.parts_from(self._epoch_from)

    @property
    def counted(self) -> bool:
        """Whether the loss has a count (weighting.py): a mean over steps then weighs each
        step by its count."""
        return any(count is not None for count in self._counts)

    def weights_from(self, start: int) -> List[float]:
        """The weights of this run's steps from number `start` on in a mean over them: their
        counts for a loss with one (one host read), else 1 each."""
        counts = self._counts[start:]
        return read_values([1.0 if count is None else count for count in counts])

    def mean_from(self, start: int) -> float:
        """The loss over this run's steps from number `start` on: Σ sums / Σ counts for a
        loss with a count, else the mean of the steps' losses (the same bits as before)."""
        losses = self.losses_from(start)
        if not self.counted:
            return sum(losses) / len(losses)
        weights = self.weights_from(start)
        return sum(loss * weight for loss, weight in zip(losses, weights)) / sum(weights)

    def epoch_totals(self) -> tuple[float, float, Dict[str, float]]:
        """(Σ w loss, Σ w, {part: Σ w part}) over the epoch's steps, w a step's count (a loss
        with one) or 1: the epoch's train loss is Σ w loss / Σ w."""
        losses, parts = self.epoch_losses(), self.epoch_parts()
        weights = self.weights_from(self._epoch_from) if self.counted else [1.0] * len(losses)
        total = sum(loss * weight for loss, weight in zip(losses, weights))
        return total, sum(weights), {k: sum(v * w for v, w in zip(values, weights)) for k, values in parts.items()}
