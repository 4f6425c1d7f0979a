"""Best-checkpoint selection and early stopping, decided the same way on every rank, and
the checks that make them possible: a monitored value the job logs (`check_monitor`), and
the same metrics on every rank (`agree_on_metrics`).

The monitored value (`checkpoint.monitor`) comes from the exact evaluation, whose sums
are all-reduced; the session also takes rank 0's value over the others' (an all-reduce in
which the other ranks give 0), so no rounding difference can ever make one rank stop while
another goes on.
The state is rebuilt from the run's history on resume, so a resumed run decides exactly
like an uninterrupted one.

Example:
    best = Best("eval_accuracy", patience=3)
    best.update({"epoch": 1, "eval_accuracy": 0.91})   # True: the first value is the best so far
    best.should_stop                                   # False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional

from .. import config as configlib
from ..config import Config
from ..errors import ConfigError
from ..runtime.env import DistEnv
from .evaluation import gather, metric_names


LOWER_IS_BETTER = ("loss", "error", "err", "mse", "mae", "rmse", "perplexity", "ppl")


@dataclass
class Best:
    monitor: str = "eval_accuracy"     # eval_accuracy | eval_loss | train_loss | eval_<metric>
    patience: int = 0                  # evaluations without improvement before stopping; 0 = never
    value: Optional[float] = None
    epoch: int = 0                     # 1-based epoch of the best value
    stale: int = 0                     # evaluations since it
    step: int = 0                      # its optimizer step, when evaluated every N steps

    @property
    def higher_is_better(self) -> bool:
        """Accuracy, mIoU, F1, AUC: higher; a loss or an error: lower."""
        return not self.monitor.endswith(LOWER_IS_BETTER)

    def update(self, metrics: Dict[str, Any]) -> bool:
        """Take one evaluation's metrics (an epoch's, or a step's); True when they hold a new best value."""
        value = metrics.get(self.monitor)
        if value is None:
            return False
        better = self.value is None or (value > self.value if self.higher_is_better
                                        else value < self.value)
        if better:
            self.value, self.epoch, self.stale = float(value), int(metrics["epoch"]), 0
            self.step = int(metrics.get("step", 0))
        else:
            self.stale += 1
        return better

    def replay(self, history: Iterable[Dict[str, Any]]) -> "Best":
        for metrics in history:
            self.update(metrics)
        return self

    @property
    def should_stop(self) -> bool:
        return bool(self.patience) and self.stale >= self.patience

    def describe(self) -> str:
        return f"best {self.monitor} {self.value:.4f} at " + (f"step {self.step}" if self.step else f"epoch {self.epoch}")


def check_monitor(parts, cfg: Config) -> None:
    """Refuse a checkpoint.monitor that the job never logs (a typo would silently leave
    it with no best checkpoint and no early stop); the default may go unlogged."""
    monitor = cfg.checkpoint.monitor
    logged = {"train_loss"}
    if parts.eval_data is not None:
        names = metric_names(parts.metrics) or (["accuracy"] if parts.task == "classification" else [])
        logged |= {"eval_loss", *(f"eval_{name}" for name in names)} if cfg.train.eval_loss else \
            {f"eval_{name}" for name in names}
    if monitor != configlib.Config().checkpoint.monitor and monitor not in logged:
        raise ConfigError(f"checkpoint.monitor={monitor} is not logged by this job; it logs "
                          f"{', '.join(sorted(logged))}")


def agree_on_metrics(parts, env: DistEnv, phase) -> None:
    """Every rank must evaluate the same metrics (they exchange their results batch by
    batch); ranks given different ones are refused, all of them, in one line."""
    names = gather(metric_names(parts.metrics), env, phase)
    if any(found != names[0] for found in names):
        given = "; ".join(f"rank {rank}: {found or 'none'}" for rank, found in enumerate(names))
        raise ConfigError(f"the ranks were given different metrics ({given}); give fit() the same "
                          "metrics on every rank")
