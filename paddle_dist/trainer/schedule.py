"""The learning-rate policy: scaled by the global batch, warmed up, then decayed.

`train.lr` is the rate for `train.lr_reference_batch` samples per optimizer step. With
`lr_scaling: linear` the run uses lr x (global batch / reference) (Goyal et al., 2017),
with `sqrt` its square root, so the same config keeps its meaning on 1 or 16 ranks. The
global batch counts every sample behind one optimizer step: batch_size x ranks x
accumulate_steps. Warm-up ramps linearly to the peak over `warmup_epochs`; then the rate
stays (`constant`), follows a half cosine to 0 at the last step (`cosine`), or is
multiplied by `lr_gamma` after each epoch in `lr_milestones` (`step`).

Pure arithmetic: both trainers set the optimizer's rate from `LrPolicy.at(step)` before
every optimizer step, so the rate is a function of the step alone (and resume is exact).

Example:
    policy = LrPolicy.from_config(cfg.train, world_size=8, steps_per_epoch=98, total_steps=9800)
    policy.peak          # 0.1 x (64 x 8 / 256) = 0.2 with lr=0.1, batch_size=64, linear
    policy.at(0)         # the first warm-up step's rate
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

from ..config import milestones as parse_milestones


def scaled_lr(lr: float, scaling: str, global_batch: int, reference_batch: int) -> float:
    """`lr` for `reference_batch` samples per step, scaled to `global_batch`.

    Example:
        scaled_lr(0.1, "linear", 512, 256)   # -> 0.2
        scaled_lr(0.1, "sqrt", 1024, 256)    # -> 0.2
    """
    ratio = global_batch / reference_batch
    return lr * {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[scaling]


@dataclass(frozen=True)
class LrPolicy:
    peak: float                       # the scaled rate, reached after warm-up
    warmup_steps: int = 0
    schedule: str = "constant"        # constant | cosine | step
    total_steps: int = 1
    milestone_steps: Tuple[int, ...] = ()
    gamma: float = 0.1

    @classmethod
    def from_config(cls, train, world_size: int, steps_per_epoch: int, total_steps: int,
                    base_lr: float = None) -> "LrPolicy":
        """The policy of `train` (a TrainConfig) for this many ranks; `base_lr` replaces
        train.lr (a user's own optimizer brings its own rate)."""
        lr = train.lr if base_lr is None else base_lr
        peak = scaled_lr(lr, train.lr_scaling, global_batch(train, world_size),
                         train.lr_reference_batch)
        return cls(peak=peak, warmup_steps=round(train.warmup_epochs * steps_per_epoch),
                   schedule=train.lr_schedule, total_steps=max(total_steps, 1),
                   milestone_steps=tuple(e * steps_per_epoch
                                         for e in parse_milestones(train.lr_milestones)),
                   gamma=train.lr_gamma)

    @property
    def varies(self) -> bool:
        """Whether the rate ever differs from the peak (else nothing needs setting per step)."""
        return bool(self.warmup_steps) or self.schedule != "constant"

    def at(self, step: int) -> float:
        """The rate for the optimizer step that follows `step` steps done (0-based)."""
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        if self.schedule == "cosine":
            span = max(self.total_steps - self.warmup_steps, 1)
            done = min(step - self.warmup_steps, span)
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * done / span))
        if self.schedule == "step":
            return self.peak * self.gamma ** sum(step >= m for m in self.milestone_steps)
        return self.peak

    def describe(self, train, world_size: int, base_lr: float) -> str:
        """One line with the effective values, for the log."""
        text = (f"lr {self.peak:.6g}: {base_lr:g} for a global batch of {train.lr_reference_batch}, "
                f"{train.lr_scaling} scaling to {global_batch(train, world_size)} "
                f"({train.batch_size} x {world_size} rank(s) x {train.accumulate_steps} micro-batch(es))")
        if self.warmup_steps >= self.total_steps and self.warmup_steps:
            return text + (f"; warm-up over {self.warmup_steps} steps, more than the "
                           f"{self.total_steps} this run makes: the rate never reaches its peak")
        if self.warmup_steps:
            text += f"; warm-up over {self.warmup_steps} steps"
        if self.schedule == "cosine":
            text += f"; cosine decay to 0 at step {self.total_steps}"
        elif self.schedule == "step":
            text += (f"; x{self.gamma:g} after steps "
                     f"{', '.join(str(m) for m in self.milestone_steps)}")
        return text


def global_batch(train, world_size: int) -> int:
    """Samples behind one optimizer step on all ranks together."""
    return train.batch_size * world_size * train.accumulate_steps


# A scheduler of the user's own that runs for a fixed length: its attribute that says it.
SCHEDULER_LENGTHS = {"CosineAnnealingDecay": "T_max", "PolynomialDecay": "decay_steps",
                     "OneCycleLR": "total_steps"}


def length_warning(scheduler, every: str, per_epoch: int, limit: int) -> str:
    """One line when the optimizer's own scheduler is sized at least 2x off the run: it is
    stepped `every` step or epoch, and the run takes `limit` optimizer steps, `per_epoch`
    an epoch (a length taken from len(DataLoader) before fit() counts every rank's samples);
    "" otherwise.

    Example:
        length_warning(CosineAnnealingDecay(0.1, T_max=64), "step", 16, 32)
        # 'the optimizer's CosineAnnealingDecay runs for T_max=64 steps, but this run takes 32 ...'
    """
    name = type(scheduler).__name__
    attribute = SCHEDULER_LENGTHS.get(name)
    length = getattr(scheduler, attribute, None) if attribute else None
    if not length or limit <= 0:
        return ""
    unit, runs = ("steps", limit) if every == "step" else ("epochs", -(-limit // max(per_epoch, 1)))
    if max(length, runs) < 2 * min(length, runs):
        return ""
    return (f"the optimizer's {name} runs for {attribute}={length} {unit}, but this run takes {runs} "
            f"({per_epoch} optimizer steps an epoch on each rank); size it from "
            "paddle_dist.steps(train_data, config).total (or .per_epoch), not len(DataLoader)")
