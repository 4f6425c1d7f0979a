"""Run by Python at the start-up of every rank of `python -m paddle_dist.launch script.py`:
this directory, holding only this file, is first on the ranks' PYTHONPATH
(protocol.script_hooks). The script and its command line stay as they are.

At start-up it imports the standard library alone, and never paddle (a script may set
variables before it imports paddle):
1. it imports the sitecustomize that Python would have imported without this one (the
   next on sys.path), so that an environment's own start-up code still runs;
2. it puts runtime/paddle_import.py's finder first on sys.meta_path (loading that file by its
   path, standard library only): the `paddle` package runs with the garbage collector
   paused, as in paddle_dist's own ranks; once it has run, `paddle.DataParallel.__init__`
   is wrapped on the class itself (so `paddle.DataParallel`,
   `paddle.distributed.DataParallel` and their subclasses are all covered);
3. each DataParallel made then is handed to paddle_dist.runtime.scripthooks.tables, which
   turns a sparse table Paddle's reducer cannot take into one line instead of a SIGSEGV,
   and .buffers, imported at that moment, which syncs its BatchNorm statistics
   (--sync-buffers) or warns that they differ between ranks.
"""

import functools
import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory that holds paddle_dist (site-packages, or a checkout): runtime/scripthooks/pythonpath/
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))


def _is_here(entry: str) -> bool:
    try:
        return os.path.abspath(entry or os.getcwd()) == HERE
    except OSError:                   # the working directory is gone
        return False


def chain_next_sitecustomize():
    """Import the sitecustomize that Python would have imported were this directory not on
    sys.path; return it (None when there is none). A failure in it is reported as Python's
    site.py reports one, and start-up goes on."""
    mine = sys.modules.pop(__name__, None)
    saved = list(sys.path)
    sys.path[:] = [entry for entry in saved if not _is_here(entry)]
    try:
        return importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _report(exc)
        return None
    except Exception as exc:         # what site.py does with a failing sitecustomize
        _report(exc)
        return None
    finally:
        sys.modules.pop("sitecustomize", None)
        if mine is not None:
            sys.modules[__name__] = mine
        # What the other one did to sys.path stays; this directory goes back where it was.
        for index, entry in enumerate(saved):
            if _is_here(entry):
                sys.path.insert(min(index, len(sys.path)), entry)


def _report(exc: BaseException) -> None:
    print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
          file=sys.stderr)


def load_paddle_import():
    """runtime/paddle_import.py, loaded by its path: the standard library only, without the
    paddle_dist package (whose import needs numpy and more)."""
    name = "_paddle_dist_paddle_import"
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                                     "paddle_import.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hook_data_parallel(paddle) -> None:
    """Wrap `paddle.DataParallel.__init__` (once) so that every DataParallel is handed to
    attach() when made."""
    cls = getattr(paddle, "DataParallel", None)
    if cls is None or getattr(cls.__init__, "_paddle_dist_hooked", False):
        return
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not getattr(self, "_paddle_dist_attached", False):    # a subclass's super().__init__
            self._paddle_dist_attached = True
            attach(self)

    __init__._paddle_dist_hooked = True
    cls.__init__ = __init__


def attach(data_parallel) -> None:
    """Hand a new DataParallel to paddle_dist (imported now, paddle being imported already):
    the copy installed with this file, should the script's sys.path not reach one."""
    if importlib.util.find_spec("paddle_dist") is None:
        sys.path.insert(0, PACKAGE_ROOT)
        try:
            importlib.import_module("paddle_dist")
        finally:
            sys.path.remove(PACKAGE_ROOT)
    from paddle_dist.runtime.scripthooks import buffers, tables
    if not buffers.made_by_paddle_dist():       # fit() keeps the tables out of the reducer itself
        tables.guard(data_parallel, buffers.wrapped(data_parallel))
    buffers.attach(data_parallel)


chained = chain_next_sitecustomize()
# Paddle's import with the collector paused, then the hook (at once if the other
# sitecustomize imported paddle already).
load_paddle_import().install(after=hook_data_parallel)
