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

A batch that cannot be collated names the sample whose layout differs from the others'
(`odd_samples`): a shuffled batch's indices are no range, and the failing one is rarely
its first or last.

Example:
    raise DataError(describe(exc, "reading sample 17 of Points"))
    # 'reading sample 17 of Points failed: ValueError: bad label (points.py:42, in __getitem__)'
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import DataError
from ..security import private

NOTE = "sample-error-"          # <job dir>/sample-error-<worker pid>: a worker's last failure
_read: List[int] = []           # in a worker: the indices read since its last collate
LISTED = 3                      # at most this many samples are named in a line


def describe(exc: BaseException, what: str, detail: str = "") -> str:
    """One line: what failed, the exception, the user's line that raised it, and `detail`."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (f"{what} failed: {type(exc).__name__}: {message}{user_frame(exc)}{': ' + detail if detail else ''}; "
            "the sample is the data's, so running again fails the same way: fix or drop it")


def collate_failure(exc: BaseException, samples: Sequence, indices: List[int], collate_fn: Callable) -> str:
    """The line for a batch `collate_fn` could not collate, naming the sample that differs.

    Example:
        collate_failure(exc, samples, [350, 300, 12], default_collate_fn)
        # 'collating samples 350, 300, 12 with default_collate_fn failed: ValueError: ...:
        #  sample 300 has float32 [3, 64, 64] in its [0] where the batch's others have ...'
    """
    what = f"collating samples {span(indices)} with {getattr(collate_fn, '__name__', 'collate_fn')}"
    return describe(exc, what, odd_samples(samples, indices))


def odd_samples(samples: Sequence, indices: List[int]) -> str:
    """Where the samples' layouts (their fields' dtypes and shapes) first differ, by index:
    the few that differ from a majority, or else the first few; "" when all are alike.

    Example:
        odd_samples([a32, a32, a64], [4, 5, 6])
        # "sample 6 has float32 [3, 64, 64] where the batch's others have float32 [3, 32, 32]"
    """
    if len(samples) != len(indices) or len(samples) < 2:
        return ""
    layouts = [dict(_fields(sample)) for sample in samples]
    paths = list(dict.fromkeys(path for layout in layouts for path in layout))
    for path in paths:          # a container's own path comes before its fields'
        kinds = [layout.get(path, "nothing") for layout in layouts]
        if len(set(kinds)) > 1:
            return _differing(kinds, indices, f" in its {path}" if path else "")
    return ""


def _differing(kinds: List[str], indices: List[int], where: str) -> str:
    (usual, count), *rest = Counter(kinds).most_common()
    odd = [(i, kind) for i, kind in zip(indices, kinds) if kind != usual]
    if count >= 2 and count > rest[0][1] and len(odd) <= LISTED:
        named = ", ".join(f"sample {i} has {kind}" for i, kind in odd)
        return f"{named}{where} where the batch's others have {usual}"
    named = ", ".join(f"sample {i} has {kind}" for i, kind in zip(indices[:LISTED], kinds))
    return (f"the samples differ{where}: {named}, ... ({len(rest) + 1} layouts in {len(kinds)} samples); "
            "pad them to one shape in a collate_fn")


def _fields(value, path: str = ""):
    """(path, kind) of a sample and of each field in it, as a collate recurses into them."""
    if isinstance(value, dict):
        yield path, "a dict of " + ", ".join(map(repr, value))
        for key, field in value.items():
            yield from _fields(field, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        yield path, f"a {type(value).__name__} of {len(value)}"
        for i, field in enumerate(value):
            yield from _fields(field, f"{path}[{i}]")
    else:
        yield path, _kind(value)


def _kind(value) -> str:
    """'float32 [3, 32, 32]' for an array or tensor, else the value's type's name."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return type(value).__name__
    return f"{str(getattr(dtype, 'name', dtype)).replace('paddle.', '')} {list(shape)}"


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
    """'32..39' for a run of consecutive indices; else the first few (a shuffled batch's
    first and last would read as a range that the failing sample need not be in)."""
    if len(indices) > 4 and list(indices) == list(range(indices[0], indices[0] + len(indices))):
        return f"{indices[0]}..{indices[-1]}"
    if len(indices) <= 5:
        return ", ".join(map(str, indices))
    return ", ".join(map(str, indices[:4])) + f", ... ({len(indices)} samples)"


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
            _note(self.folder, collate_failure(exc, samples, indices, self.collate_fn))
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
