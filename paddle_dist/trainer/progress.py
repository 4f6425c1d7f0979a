"""Per-rank log files, console progress and VisualDL scalars.

Every rank writes `<run>/logs/rank<N>.log`. Global rank 0 prints to the console and
writes VisualDL scalars under `<run>/vdl`; in a job on several machines the first rank of
every other machine (local rank 0) prints too, so that each machine's terminal shows its
progress and its end, and every console line then starts with its machine
(`[node 1 nodeB] epoch 1/5 step 20/63 ...`; a job on one machine prints no label).

Example:
    log = setup(run_dir, env)
    progress = Progress(env, run_dir, steps_per_epoch=63, epochs=5, batch_size=64, log_every=20)
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import paddle

from ..runs.layout import Run
from ..security import private
from ..runtime.env import DistEnv

NAME = "paddle_dist"


class _RunLog(logging.FileHandler):
    """A rank's log in its run directory, never written through a link (private.nofollow)."""

    def _open(self):
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors,
                    opener=private.nofollow)


def setup(run_dir: Optional[Path], env: DistEnv) -> logging.Logger:
    """Configure the `paddle_dist` logger for this rank (replacing earlier handlers)."""
    log = logging.getLogger(NAME)
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    if run_dir is not None:
        Run(run_dir).logs.mkdir(parents=True, exist_ok=True)
        file_handler = _RunLog(Run(run_dir).rank_log(env.global_rank))
        file_handler.setFormatter(logging.Formatter(
            f"%(asctime)s rank{env.global_rank} %(levelname)s %(message)s"))
        log.addHandler(file_handler)
    if prints(env):
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter(console_label(env).replace("%", "%%") + "%(message)s"))
        # A record logged with extra={"console": False} goes to the rank's log file only.
        console.addFilter(lambda record: getattr(record, "console", True))
        log.addHandler(console)
    return log


def prints(env: DistEnv) -> bool:
    """Whether this rank prints to the console: global rank 0, and the first rank of each
    machine of a job on several machines."""
    return env.is_main or (env.nnodes > 1 and env.is_local_main)


def console_label(env: DistEnv, host: str = "") -> str:
    """What starts this rank's console lines: "" on one machine, else its machine.

    Example:
        console_label(DistEnv(nnodes=2, node_rank=1), "nodeB")    # '[node 1 nodeB] '
    """
    if env.nnodes <= 1:
        return ""
    return f"[node {env.node_rank} {host or socket.gethostname()}] "


def get() -> logging.Logger:
    return logging.getLogger(NAME)


def format_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Step and epoch reporting shared by both trainers.

    `step(lr)` is called after every optimizer step, once the Session recorded the step's
    loss in its `ledger` (ledger.py: a device tensor from the loop trainer, a number from
    hapi). A line goes out every `log_every` steps and at each epoch's end with the mean
    loss of the steps since the last line, global samples/s (and tokens/s, the loss's count
    per second over every rank, for a loss with a count: weighting.py) and an ETA; the
    ledger reads the losses on the host only then, all at once.
    """

    def __init__(self, env: DistEnv, run_dir: Optional[Path], steps_per_epoch: int, epochs: int,
                 batch_size: int, log_every: int, total_steps: Optional[int] = None,
                 start_step: int = 0, by_steps: bool = False, ledger=None,
                 over_ranks: Callable[[float], float] = lambda value: value):
        # over_ranks: the ranks' mean of a number (a collective every rank calls at its
        # reports, which fall on the same steps): a plain loss's window is each rank's own.
        self.env, self.log, self.ledger, self.over_ranks = env, get(), ledger, over_ranks
        self.steps_per_epoch, self.epochs, self.log_every = steps_per_epoch, epochs, log_every
        self.global_batch = batch_size * env.world_size
        self.total_steps = total_steps or steps_per_epoch * epochs
        self.start_step = start_step          # steps done before this run (resume)
        self.by_steps = by_steps              # train.max_steps: lines count the run's steps first
        self.step_count = 0                   # steps of this run
        self._reported = 0                    # steps of this run before the last report
        self.train_time, self._t_last = 0.0, None
        self._mark = (0, 0.0, 0.0)            # (steps, train time, comm time) at the last report
        self.writer = _visualdl_writer(run_dir) if env.is_main and run_dir else None
        self.grad_norm = None     # an ema.MeasuredClip: its last norm is printed at each report
        # The loss's count (tokens) of this run's first `_counted_steps` steps, over every
        # rank, and their training time; None for a loss without a count.
        self.counted, self._counted_time, self._counted_steps = None, 0.0, 0

    def epoch_begin(self, epoch: int, done: int = 0) -> None:
        """Start the clock for `epoch`, of which `done` steps were already done (resume)."""
        self.epoch, self.epoch_step, self._t_last = epoch, done, time.perf_counter()

    def step(self, lr: float, comm_s: Optional[float] = None) -> None:
        """After an optimizer step whose loss the ledger holds. `comm_s`: seconds spent
        communicating so far, when measurable (it splits the time per step into compute
        and communication in VisualDL)."""
        now = time.perf_counter()
        self.train_time += now - self._t_last
        self._t_last = now
        self.step_count += 1
        self.epoch_step += 1
        if self.epoch_step % self.log_every == 0 or self.epoch_step == self.steps_per_epoch:
            self._report(lr)
            self._report_times(comm_s)

    def _report_times(self, comm_s: Optional[float]) -> None:
        steps = self.step_count - self._mark[0]
        spent, comm = self.train_time - self._mark[1], (comm_s or 0.0) - self._mark[2]
        self._mark = (self.step_count, self.train_time, comm_s or 0.0)
        if steps <= 0:
            return
        self.scalar("time/step_ms", 1000 * spent / steps)
        if comm_s is not None:
            self.scalar("time/comm_ms", 1000 * comm / steps)
            self.scalar("time/compute_ms", 1000 * (spent - comm) / steps)

    def pause(self) -> None:
        """Stop the training clock (evaluation, checkpointing)."""
        self._t_last = None

    def resume(self) -> None:
        self._t_last = time.perf_counter()

    @property
    def samples_per_s(self) -> float:
        return self.step_count * self.global_batch / self.train_time if self.train_time else 0.0

    @property
    def tokens_per_s(self) -> Optional[float]:
        """The loss's count per second over all of this run's steps so far, over every rank
        (tokens/s for a token loss); None for a loss without a count. The steps since the
        last report are counted when asked: a run that train.max_steps ends between two
        lines gives metrics.json the count of every step over the time of every step."""
        self._count()
        return self.counted / self._counted_time if self.counted is not None and self._counted_time else None

    def _count(self) -> None:
        """Add the counts of the steps not counted yet (one host read for all of them)."""
        if self.ledger is None or self._counted_steps >= self.step_count:
            return
        counted = self.ledger.counted_from(self._counted_steps)
        self._counted_steps = self.step_count
        if counted is not None:
            self.counted, self._counted_time = (self.counted or 0.0) + counted, self.train_time

    def _report(self, lr: float) -> None:
        start, self._reported = self._reported, self.step_count
        mean = self.ledger.mean_from(start)      # the steps since the last report (weighed by their counts)
        if self.ledger.local_from(start):
            mean = self.over_ranks(mean)
        speed = self.samples_per_s
        tokens = f" {self.tokens_per_s:,.0f} tokens/s" if self.tokens_per_s else ""
        remaining = self.total_steps - self.start_step - self.step_count
        eta = remaining * self.global_batch / speed if speed else 0
        norm = ""
        if self.grad_norm is not None and self.grad_norm.last is not None:
            value = read_values([self.grad_norm.last])[0]        # the last step's, after averaging
            norm = f" grad norm {value:.3g}"
            self.scalar("train/grad_norm", value)
        parts = {k: sum(v) / len(v) for k, v in self.ledger.parts_from(start).items()}
        steps = f"; step {self.start_step + self.step_count}/{self.total_steps}" if self.by_steps else ""
        self.log.info(f"epoch {self.epoch + 1}/{self.epochs} step {self.epoch_step}/{self.steps_per_epoch} "
                      f"loss {mean:.4f}{_said(parts)} lr {lr:.2e}{norm} {speed:,.0f} samples/s{tokens} eta {format_eta(eta)}{steps}")
        self.scalar("train/loss", mean)
        for name, value in parts.items():
            self.scalar(f"train/{name}", value)
        self.scalar("train/lr", lr)
        self.scalar("train/samples_per_s", speed)
        if tokens:
            self.scalar("train/tokens_per_s", self.tokens_per_s)

    def epoch_end(self, epoch: int, train_loss: float, metrics: Dict[str, float],
                  parts: Optional[Dict[str, float]] = None) -> None:
        line = f"epoch {epoch + 1}/{self.epochs} done: train loss {train_loss:.4f}{_said(parts or {})}"
        for key, value in (parts or {}).items():
            self.scalar(f"train_epoch/{key}", value, step=epoch + 1)
        numbers = {k: v for k, v in metrics.items() if k != "count" and isinstance(v, (int, float))}
        if metrics:
            found = " ".join(f"{k} {v:.4f}" for k, v in numbers.items())
            line += f" | eval {found} on {int(metrics['count'])} samples"
        self.log.info(line)
        for key, value in numbers.items():       # a metric of several values is in metrics.json
            self.scalar(f"eval/{key}", value, step=epoch + 1)

    def eval_line(self, step: int, metrics: Dict[str, float]) -> None:
        """An evaluation after optimizer step `step` (train.eval_every_steps)."""
        numbers = {k: v for k, v in metrics.items() if k != "count" and isinstance(v, (int, float))}
        found = " ".join(f"{k} {v:.4f}" for k, v in numbers.items())
        self.log.info(f"step {step}/{self.total_steps}: eval {found} on {int(metrics.get('count', 0))} samples")
        for key, value in numbers.items():
            self.scalar(f"eval/{key}", value, step=step)

    def scalar(self, tag: str, value: float, step: Optional[int] = None) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag=tag, value=float(value),
                                   step=self.start_step + self.step_count if step is None else step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _said(parts: Dict[str, float]) -> str:
    """' (loss_cls 0.5012, loss_box 0.2231)': a loss's parts beside it."""
    return f" ({', '.join(f'{k} {v:.4f}' for k, v in parts.items())})" if parts else ""


def read_values(values: Sequence) -> List[float]:
    """`values` (paddle tensors and numbers) as floats, with one host read for all the
    tensors: they are gathered into one first, so a GPU waits once, not once per value.

    Example:
        read_values([paddle.to_tensor(0.5), 2])   # [0.5, 2.0]
    """
    tensors = [v.reshape([1]).astype("float64") for v in values if isinstance(v, paddle.Tensor)]
    read = iter(paddle.concat(tensors).numpy().tolist() if tensors else [])
    return [next(read) if isinstance(v, paddle.Tensor) else float(v) for v in values]


def _visualdl_writer(run_dir: Path):
    """A writer that appends to the run's newest log file: VisualDL shows only the newest
    file of a directory, so a resumed run must not start a second one."""
    from visualdl import LogWriter

    logdir = Run(run_dir).vdl
    existing = sorted(logdir.glob("vdlrecords.*.log"), key=lambda p: p.stat().st_mtime)
    with contextlib.redirect_stdout(io.StringIO()):     # "... is exists, VisualDL will add logs to it."
        return LogWriter(logdir=str(logdir), file_name=existing[-1].name if existing else "")
