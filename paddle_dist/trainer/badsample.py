"""A sample that cannot be read or collated names itself: the user's own exception (its
type, its message, the user's line that raised it) and the sample's index, with and
without DataLoader workers, as one line and exit 2 (errors.DataError), never a run to
continue (it would fail again at the same sample).

In this process (no workers) the dataset's `__getitem__` and the collate function are
called by SampleLoader, which describes the failure itself (`describe`). In a worker,
Paddle kills the batch queue and the rank sees only `SystemError: (Fatal) Blocking queue
is killed because the data reader raises an exception`; so the dataset and the collate
function run inside `Guarded`/`GuardedCollate`, which write the description to a file
of their own in the job's private directory before the worker dies, and the rank's
loader (`raise_noted`) raises it in place of Paddle's line.

Example:
    raise DataError(describe(exc, "reading sample 17 of Points"))
    # 'reading sample 17 of Points failed: ValueError: bad label (points.py:42, in __getitem__)'
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Callable, List, Optional

from ..errors import DataError
from ..security import private

NOTE = "sample-error-"          # <job dir>/sample-error-<worker pid>: a worker's last failure
_read: List[int] = []           # in a worker: the indices read since its last collate


def describe(exc: BaseException, what: str) -> str:
    """One line: what failed, the exception, and the user's line that raised it."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (f"{what} failed: {type(exc).__name__}: {message}{user_frame(exc)}; the sample is the data's, so "
            "running again fails the same way: fix or drop it")


def user_frame(exc: BaseException) -> str:
    """' (file.py:42, in fn)': the innermost frame of `exc` outside Paddle and paddle_dist
    (the user's code, or a library of theirs), or ""."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/paddle/" not in f.filename and "/paddle_dist/" not in f.filename]
    return f" ({Path(frames[-1].filename).name}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""


def name_of(dataset) -> str:
    """The user's dataset's class name, through paddle_dist's wrappers (SeededSamples, Guarded)."""
    while hasattr(dataset, "dataset") and type(dataset).__module__.startswith("paddle_dist."):
        dataset = dataset.dataset
    return type(dataset).__name__


def span(indices: List[int]) -> str:
    return ", ".join(map(str, indices)) if len(indices) <= 4 else f"{indices[0]}..{indices[-1]}"


class Guarded:
    """A dataset whose failing `__getitem__` leaves its description in `folder` (a worker)."""

    def __init__(self, dataset, folder: str):
        self.dataset, self.folder = dataset, folder

    def __getitem__(self, index):
        _read.append(index)
        try:
            return self.dataset[index]
        except Exception as exc:
            _note(self.folder, describe(exc, f"reading sample {index} of {name_of(self.dataset)}"))
            raise

    def __len__(self):
        return len(self.dataset)

    def __getattr__(self, name):          # what else the dataset offers (batch(), classes)
        if name == "dataset":             # not set yet (a copy being unpickled): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


class GuardedCollate:
    """A collate function whose failure leaves its description in `folder` (a worker)."""

    def __init__(self, collate_fn: Callable, folder: str):
        self.collate_fn, self.folder = collate_fn, folder

    def __call__(self, samples):
        indices = list(_read)
        _read.clear()
        try:
            return self.collate_fn(samples)
        except Exception as exc:
            _note(self.folder, describe(exc, f"collating samples {span(indices)} with "
                                             f"{getattr(self.collate_fn, '__name__', 'collate_fn')}"))
            raise


def _note(folder: str, line: str) -> None:
    if not folder:
        return
    try:
        with os.fdopen(private.create(os.path.join(folder, f"{NOTE}{os.getpid()}")), "w") as f:
            f.write(line)
    except OSError:
        pass          # a second failure of the same worker: its first note stands


def raise_noted(folder: Optional[str], exc: BaseException) -> None:
    """Raise a worker's note (DataError) for the loader failure `exc`, if a worker left one."""
    if not folder:
        return
    notes = sorted(Path(folder).glob(f"{NOTE}*"))
    if notes:
        line = notes[0].read_text()
        for note in notes:
            note.unlink(missing_ok=True)
        raise DataError(line) from exc
