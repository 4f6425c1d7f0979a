"""A rank's status record, `<run>/status/rank<N>.json`: one type that its writers (the rank,
runtime/monitor.py; its watchdog process, runtime/_deadline.py) and its readers (report.py,
listing.py, rundir.py) share, as torch's elastic `ProcessFailure` is shared.

The file is a JSON object. Keys that a writer leaves out stay out (a watchdog's record has
no "log", a hand-made one may have no "step"): a field that was absent is None here, and is
written back absent. Keys this type does not know are kept, in `extra`, and written back.
Standard library only, and no package-relative import: runtime/_deadline.py, a plain
script, imports this file with its folder on sys.path.

Example:
    RankStatus(rank=1, state=FAILED, step=5, error="boom").write(run / "status" / "rank1.json")
    read_all(run)[1].state       # 'failed'
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

RUNNING = "running"        # training (or setting up); a record of a dead pid in this state: died unrecorded
DONE = "done"
FAILED = "failed"          # raised, or missed its rendezvous deadline
REFUSED = "refused"        # ended on a user error (errors.UserError): run as it was, it would fail again
STOPPED = "stopped"        # stopped because a peer failed
HUNG = "hung"              # the hang watchdog stopped it
PREEMPTED = "preempted"    # stopped on request (SIGTERM/SIGUSR1) after saving
DIVERGED = "diverged"      # the ranks' weights differed: the run is never continued
# A rank that ended by itself, a candidate root cause: an exception, a user error, a hang.
ENDED_BADLY = (FAILED, REFUSED, HUNG)
FOLDER = "status"          # in a run directory

PathLike = Union[str, os.PathLike]


@dataclass
class RankStatus:
    """One rank's record. `time` is time.time() of the write; `step` and `epoch` (1-based)
    its progress; the error fields are a failure's (`exit_code`: errors.exit_code_of)."""
    rank: int
    local_rank: Optional[int] = None
    host: Optional[str] = None
    pid: Optional[int] = None
    state: Optional[str] = None
    step: Optional[int] = None
    epoch: Optional[int] = None
    phase: Optional[str] = None
    time: Optional[float] = None
    log: Optional[str] = None
    error_type: Optional[str] = None
    error: Optional[str] = None
    exit_code: Optional[int] = None
    traceback: Optional[str] = None
    message: Optional[str] = None
    collective: Optional[str] = None        # a hung rank's collective (its heartbeat's kind)
    weights_sha256: Optional[str] = None    # a rank that finished: its final weights' digest
    extra: Dict[str, Any] = field(default_factory=dict)    # keys this type does not know

    @classmethod
    def make(cls, /, **values: Any) -> "RankStatus":
        """A record from keyword values, the unknown ones kept in `extra`.

        Example:
            RankStatus.make(rank=0, state="done", loss=0.1).extra     # {'loss': 0.1}
        """
        known = {name: values.pop(name) for name in _FIELDS if name in values}
        return cls(**known, extra=values)

    @classmethod
    def of(cls, record: Union["RankStatus", Mapping[str, Any]]) -> "RankStatus":
        """`record` as a RankStatus: itself, or a JSON object read (or built) as a dict."""
        return record if isinstance(record, RankStatus) else cls.make(**dict(record))

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object: the fields that are set, in their order, then `extra`."""
        found = {name: getattr(self, name) for name in _FIELDS if getattr(self, name) is not None}
        found.update(self.extra)
        return found

    def write(self, path: PathLike) -> None:
        """Write the record to `path` atomically (a temporary file, then os.replace):
        readers never see half of it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        # Never through a link (security/private.nofollow; the watchdog imports this
        # module alone, so nothing of the package is imported here).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.to_dict()))
        os.replace(tmp, path)


_FIELDS = tuple(f.name for f in fields(RankStatus) if f.name != "extra")


def path_of(run_dir: PathLike, rank: int) -> Path:
    """Where rank `rank` of run `run_dir` keeps its record: `<run>/status/rank<N>.json`."""
    return Path(run_dir) / FOLDER / f"rank{rank}.json"


def files(run_dir: PathLike) -> List[Path]:
    """The record files of run `run_dir`, sorted by name ([] when it has none)."""
    return sorted((Path(run_dir) / FOLDER).glob("rank*.json"))


def read(path: PathLike) -> Optional[RankStatus]:
    """The record in `path`; None when it is missing, unreadable (half-written by a writer
    that is no paddle_dist's), not a JSON object, or names no rank (a record without one
    is its file name's: rank<N>.json).

    Example:
        read("runs/mnist_lenet-20261123-061500/status/rank1.json").state    # 'failed'
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    try:
        raw["rank"] = int(raw["rank"] if "rank" in raw else path.stem[len("rank"):])
    except (TypeError, ValueError):
        return None
    return RankStatus.make(**raw)


def read_all(run_dir: Optional[PathLike]) -> Dict[int, RankStatus]:
    """Every rank's record of run `run_dir` ({} without one), by global rank.

    Example:
        {rank: record.state for rank, record in read_all(run).items()}   # {0: 'stopped', 1: 'failed'}
    """
    found: Dict[int, RankStatus] = {}
    for path in files(run_dir) if run_dir else ():
        record = read(path)
        if record is not None:
            found[record.rank] = record
    return found
