"""Every path inside a run directory, in one place, and which checkpoint is the latest: the
standard library only, so that reading runs (`python -m paddle_dist.runs`, the launcher's
report) never needs paddle.

    <run>/
      run.json              the run's identity (runs/rundir.py)
      config.yaml           the resolved config, as the run trained
      metrics.json          the finished run's result
      classes.json          an image folder's class names
      samples.tsv           each step's sample digest (train.log_samples), after a "# attempt N" line per attempt
      logs/rank<R>.log      each rank's log
      status/rank<R>.json   each rank's status records (runs/status.py)
      checkpoints/          ckpt_<step, 9 digits>/{model,optimizer,ema,rng}.npz, meta.json;
                            `latest` names the newest
      best/                 the best checkpoint, the same layout
      vdl/                  VisualDL's scalars
      export/               the inference model (python -m paddle_dist.export)
      launch/               the built-in job's ranks' output, workerlog.<R> (a multi-node
                            job: launch-node<N>/, per machine, which may share the run)

Example:
    run = Run(Path("runs/mnist-1"))
    run.rank_log(0)                 # runs/mnist-1/logs/rank0.log
    latest(run.checkpoints)         # runs/mnist-1/checkpoints/ckpt_000000120, or None
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from . import status as status_files      # the watchdog imports status.py alone: its own folder name

RUN_FILE, CONFIG, METRICS, CLASSES, SAMPLES = "run.json", "config.yaml", "metrics.json", "classes.json", "samples.tsv"
LOGS, STATUS, CHECKPOINTS, BEST, VDL, EXPORT = "logs", status_files.FOLDER, "checkpoints", "best", "vdl", "export"
LATEST = "latest"               # in a checkpoints root: the newest checkpoint's name
META = "meta.json"              # in a checkpoint
CHECKPOINT = re.compile(r"ckpt_(\d+)")


@dataclass(frozen=True)
class Run:
    """The paths of one run directory."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    run_file = property(lambda self: self.root / RUN_FILE)
    config = property(lambda self: self.root / CONFIG)
    metrics = property(lambda self: self.root / METRICS)
    classes = property(lambda self: self.root / CLASSES)
    samples = property(lambda self: self.root / SAMPLES)
    logs = property(lambda self: self.root / LOGS)
    status = property(lambda self: self.root / STATUS)
    checkpoints = property(lambda self: self.root / CHECKPOINTS)
    best = property(lambda self: self.root / BEST)
    vdl = property(lambda self: self.root / VDL)
    export = property(lambda self: self.root / EXPORT)

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_status(self, rank: int) -> Path:
        return status_files.path_of(self.root, rank)

    def launch_logs(self, nnodes: int = 1, node_rank: int = 0) -> Path:
        """Where the ranks' launcher writes their workerlog.<R> files: `launch/`, or per
        machine (`launch-node<N>/`) in a multi-node job, whose machines may share the run."""
        return self.root / ("launch" if nnodes == 1 else f"launch-node{node_rank}")

    def is_run(self) -> bool:
        """Whether a run wrote its config here (what makes a folder a run)."""
        return self.config.is_file()

    def has_checkpoints(self) -> bool:
        return bool(checkpoint_dirs(self.checkpoints))

    @classmethod
    def of_checkpoint(cls, checkpoint: Path) -> Optional["Run"]:
        """The run a checkpoint directory belongs to (<run>/checkpoints/ckpt_* or
        <run>/best/ckpt_*), or None."""
        root = Path(checkpoint).parent
        if root.name not in (CHECKPOINTS, BEST) or not cls(root.parent).is_run():
            return None
        return cls(root.parent)


def checkpoint_name(step: int) -> str:
    """ckpt_000000120: zero-padded, so that name order is step order."""
    return f"ckpt_{step:09d}"


def checkpoint_dirs(root: Path) -> List[Path]:
    """The ckpt_* directories under a checkpoints root, oldest step first."""
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return []
    found = [(int(m.group(1)), p) for p in entries if (m := CHECKPOINT.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest(root: Path) -> Optional[Path]:
    """The checkpoint `root/latest` names; if that is missing or gone, the newest ckpt_*
    directory (a crash can land between the two renames of a save); else None."""
    root = Path(root)
    try:
        name = (root / LATEST).read_text().strip()
    except (OSError, ValueError):
        name = ""
    if name and name == Path(name).name and not name.startswith(".") and (root / name).is_dir():
        return root / name
    found = checkpoint_dirs(root)
    return found[-1] if found else None
