"""`import paddle`, made cheaper in every process paddle_dist starts or is imported into first.

Paddle's import makes about 190,000 objects that live as long as the process. Python's cyclic
garbage collector runs again and again while they are made, each full pass walking all of
them, and once more at exit: about a third of the import's CPU time (0.34 of 1.14
CPU-seconds per rank here, docs/benchmarks.md). Here the package runs with the collector paused, then
`gc.freeze()` moves what it made out of the collector's sight for good: later passes and the
one at exit skip it, and DataLoader workers forked from a rank leave those pages shared
instead of copying them (gc.freeze's own purpose). Reference counting still frees what is
dropped; only a cycle made during the import is never collected.

Two callers put the finder first on sys.meta_path before paddle is imported:
- `import paddle_dist` (paddle_dist/__init__.py): paddle_dist's own commands and ranks, and
  a script that imports paddle_dist before paddle;
- the sitecustomize of a plain script's ranks (scripthooks/pythonpath/sitecustomize.py), which
  loads this file by its path, standard library only, and adds its DataParallel hook as
  `after`.
Where paddle was imported before either, nothing changes.

The import also leaves out Paddle's two-line warning that OMP_NUM_THREADS is above 1, when
the count is the one paddle_dist's launcher chose for the rank (a share of the cores: one
rank on 2 cores gets 2), marked in `OMP_CHOSEN`; a count of the user's own keeps it.

Example:
    install()               # then, anywhere later: import paddle
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Callable, Optional

# The OpenMP thread count the launcher chose for a rank (runtime/variables.py), read here
# rather than in runtime/env.py: a plain script's sitecustomize loads this file alone.
OMP_CHOSEN = "PADDLE_DIST_OMP_NUM_THREADS"
# What `import paddle` prints when OMP_NUM_THREADS > 1 (paddle/base/__init__.py, 2.6 to 3.3).
OMP_WARNING = ("WARNING: OMP_NUM_THREADS set to ", "PLEASE USE OMP_NUM_THREADS WISELY.")


@contextlib.contextmanager
def collector_paused():
    """Run the block with the cyclic collector off, then freeze every object tracked so far
    and give the collector back as it was (a script that turned it off keeps it off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


class _Unwarned:
    """sys.stderr without Paddle's OMP_NUM_THREADS lines, while paddle is imported: whole
    lines are passed on as they end, the rest when the import is over (`close`)."""

    def __init__(self, stream):
        self.stream, self.pending = stream, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if not line.startswith(OMP_WARNING):
                self.stream.write(line + "\n")
        return len(text)

    def close(self) -> None:
        if self.pending:
            self.stream.write(self.pending)
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def openmp_unwarned():
    """Run the block (paddle's import) without Paddle's warning on OMP_NUM_THREADS, when the
    count is the launcher's (`OMP_CHOSEN`).

    Example:
        with openmp_unwarned():
            import paddle            # no 'WARNING: OMP_NUM_THREADS set to 2, not 1' for a rank
    """
    chosen = os.environ.get(OMP_CHOSEN)
    if not chosen or chosen != os.environ.get("OMP_NUM_THREADS"):
        yield
        return
    stream = sys.stderr
    sys.stderr = quiet = _Unwarned(stream)
    try:
        yield
    finally:
        if sys.stderr is quiet:          # a module that replaced it meanwhile keeps its own
            sys.stderr = stream
        quiet.close()


class _PausedLoader:
    """The loader of `paddle`, running the package with the collector paused, then `after`.
    Paddle itself only ever sees its own loader (put back before the package runs)."""

    def __init__(self, loader, after: Optional[Callable]):
        self.loader, self.after = loader, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        with collector_paused(), openmp_unwarned():
            self.loader.exec_module(module)
        if self.after is not None:
            self.after(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class PaddleFinder:
    """On sys.meta_path: finds `paddle` with the other finders and hands back its spec with
    a loader that runs the package with the collector paused, then calls `after(paddle)`."""

    pauses_collector = True           # what install() looks for (this file may be loaded twice)

    def __init__(self, after: Optional[Callable] = None):
        self.after = after

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "paddle":
            return None
        for finder in sys.meta_path:
            if getattr(finder, "pauses_collector", False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PausedLoader(spec.loader, self.after)
                return spec
        return None


def install(after: Optional[Callable] = None) -> None:
    """Put a PaddleFinder first on sys.meta_path, unless one is there already. When paddle
    is imported already, call `after(paddle)` at once instead."""
    loaded = sys.modules.get("paddle")
    if loaded is not None:
        if after is not None:
            after(loaded)
    elif not any(getattr(finder, "pauses_collector", False) for finder in sys.meta_path):
        sys.meta_path.insert(0, PaddleFinder(after))
