"""One rank's training run, shared by both trainers (`Session`): counters, progress,
checkpoints, evaluation, stop requests. It is built from one `SessionSetup`, everything
resolved before training starts, and nothing patches it afterwards.

Example:
    session = Session(SessionSetup(parts=parts, cfg=cfg, env=env, run_dir=run_dir, ...))
    session.before_step(); ...; session.after_step(loss)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from paddle.optimizer.lr import LRScheduler

from ..runs.layout import Run
from .. import checkpoint
from ..checkpoint import Meta
from ..config import Config
from .amp import scaler_state as amp_scaler_state
from ..errors import Preempted
from ..runtime.env import DistEnv
from . import agreement, untrained
from .callbacks import Events, ModelView, hapi_logs
from .engine import Engine
from .firstbatch import FirstBatch
from .ledger import LossLedger
from .parts import Parts, Position, Result
from .ema import Ema
from .optim import MeasuredClip
from .evaluation import EvalSetup, all_reduce_sum, evaluate, exchange_rounds, metric_names
from .progress import Progress
from .randomness import MicroBatchDraws
from .sampling import PlannedBatchSampler
from .selection import Best
from .state import Resumed
from .weighting import perplexity
from ..security import private


@dataclass(frozen=True)
class SessionSetup:
    """Everything a Session is built from, resolved before it starts (the trainer's job.py
    makes it): the parts, where the run is, how the ranks make a step, where it starts
    (`resumed`: the one record a resume returns) and ends, and the training data."""

    parts: Parts
    cfg: Config
    env: DistEnv
    run_dir: Optional[Path]
    progress: Progress
    ledger: LossLedger                  # the steps' losses (progress reads them too)
    monitor: Any                        # runtime.monitor.Monitor
    engine: Engine                      # the distributed step: sync, BatchNorm, scaler, autocast
    optimizer: Any
    resumed: Resumed                    # where it starts: position, plan, history, EMA
    limit: int                          # the run's last optimizer step
    config_hash: str
    loader: Any                         # this rank's training batches (sampling.train_loader)
    sampler: PlannedBatchSampler        # ... and their sampler
    first: FirstBatch = FirstBatch()    # what the check before epoch 1 found
    lr_policy: Any = None


# ------------------------------------------------------------------ the session
class Session:
    """One rank's training run: counters, progress, checkpoints, stop requests.

    Both trainers call `after_step(loss)` after every optimizer step and
    `end_epoch(epoch)` after every epoch; everything else is shared here, the stepping of
    the optimizer's own LRScheduler included (`step_scheduler`). The losses are
    kept in the ledger, read on the host at the progress line's reports and epoch ends only.
    """

    def __init__(self, setup: SessionSetup):
        parts, cfg, env, optimizer, progress = setup.parts, setup.cfg, setup.env, setup.optimizer, setup.progress
        resumed = setup.resumed
        self.parts, self.cfg, self.env, self.run_dir = parts, cfg, env, setup.run_dir
        self.progress, self.monitor, self.engine, self.optimizer = progress, setup.monitor, setup.engine, optimizer
        self.ledger, self.loader, self.sampler, self.first = setup.ledger, setup.loader, setup.sampler, setup.first
        self.pos, self.limit, self.config_hash = dataclasses.replace(resumed.start), setup.limit, setup.config_hash
        # The resumed epoch's losses from before the resume (Position.epoch_loss).
        self.resumed_epoch, self.pos_loss = resumed.start.epoch, resumed.start.epoch_loss
        self.lr_policy = lr_policy = setup.lr_policy
        # The optimizer's own LRScheduler, stepped here (train.scheduler_every) at both API
        # levels; paddle_dist's lr policy and such a scheduler exclude each other (_lr_policy).
        own = getattr(optimizer, "_learning_rate", None)
        self.events = Events(parts.callbacks, ModelView(parts.model, optimizer, env.is_main),
                             {"batch_size": cfg.train.batch_size, "epochs": cfg.train.epochs,
                              "steps": progress.steps_per_epoch, "verbose": 0,
                              "metrics": ["loss", *metric_names(parts.metrics)]})
        # Paddle's LRScheduler callback, if given, steps the scheduler by its own rule.
        steps_own = isinstance(own, LRScheduler) and lr_policy is None and not self.events.steps_scheduler()
        self.scheduler = own if steps_own else None
        self.ema = _ema(parts.model, cfg, resumed, progress.log)
        clip = getattr(optimizer, "_grad_clip", None)
        progress.grad_norm = clip if isinstance(clip, MeasuredClip) else None
        self.best = Best(cfg.checkpoint.monitor, cfg.train.early_stop_patience).replay(resumed.history)
        self.saver = checkpoint.AsyncSaver(on_written=self._say_written)
        self.checked_at = -1          # the step whose weights the ranks last compared
        # Which samples each step trains on (sampling.py); a continued run's, from its checkpoint.
        self.plan = resumed.plan
        self.draws = MicroBatchDraws(cfg.train.seed, env.global_rank)
        self.samples_marked = False     # samples.tsv has this attempt's line (_log_samples)
        self.result = Result(run_dir=setup.run_dir, history=resumed.history, resumed_from=resumed.path)

    @property
    def done(self) -> bool:
        return self.pos.global_step >= self.limit

    def begin_epoch(self, epoch: int) -> None:
        if epoch != self.pos.epoch:
            self.pos = Position(epoch=epoch, global_step=self.pos.global_step)
        self.progress.epoch_begin(epoch, self.pos.step_in_epoch)
        self.ledger.begin_epoch()
        self.events.epoch_begin(epoch)

    def before_step(self) -> None:
        """Set the rate for the coming optimizer step (a function of the step alone)."""
        if self.lr_policy is not None:
            self.optimizer.set_lr(self.lr_policy.at(self.pos.global_step))
        if self.events:
            self.events.batch_begin(self.pos.step_in_epoch)

    def seed_micro_batch(self, index: int, share: int) -> None:
        """Seed the generators before this rank's micro-batch `index` of `share` in the
        coming optimizer step: dropout draws the same masks for it on any number of ranks
        (randomness.py)."""
        self.draws.seed(self.pos.global_step, index, share)

    def after_step(self, loss, parts: Optional[Dict[str, Any]] = None, count=None, local: bool = False) -> bool:
        """Bookkeeping after an optimizer step; True when the step limit is reached.
        `loss`: the step's mean loss, a device tensor (left unread) or a number; `parts`:
        the means of its parts by name (feed.loss_parts), likewise; `count`: the loss's
        count over every rank (StepResult.count: tokens), likewise, or None; `local`: the
        loss is this rank's alone (StepResult.local)."""
        self.pos.step_in_epoch += 1
        self.pos.global_step += 1
        self._log_samples()
        self.engine.after_update()
        if self.ema is not None:
            self.ema.update()
        self.result.step_times.append(time.perf_counter())
        if self.result.first_step_at is None:
            self.result.first_step_at = time.time()
        sync = self.engine.sync
        measurable = self.env.is_distributed and sync.mode != "dataparallel"
        lr = float(self.optimizer.get_lr())
        self.ledger.record(loss, parts or {}, count, local)
        self.progress.step(lr, sync.comm_seconds if measurable else None)
        if self.events:       # hapi's logs hold numbers: the loss is read here (a host wait)
            self.events.batch_end(self.pos.step_in_epoch - 1, {
                "loss": [float(loss)], **{k: [float(v)] for k, v in (parts or {}).items()},
                "lr": lr, "batch_size": self.cfg.train.batch_size})
        self.step_scheduler("step")
        self.monitor.step(self.pos.global_step, self.pos.epoch)
        self.monitor.perturb(self.parts.model, self.pos.global_step)     # faults.inject=perturb
        if sync.stop_requested:
            self._stop_for_preemption()
        evals = self.cfg.train.eval_every_steps     # first: a checkpoint of this step holds its evaluation
        if evals and self.parts.eval_data is not None and (self.pos.global_step % evals == 0 or self.done):
            self._evaluate_at_step()
        every = self.cfg.checkpoint.every_steps
        if every and self.pos.global_step % every == 0 and not self.done:
            self._save_mid_epoch()
        return self.done

    def _evaluate_at_step(self) -> None:
        """train.eval_every_steps: an evaluation after this optimizer step, mid-epoch too,
        with its entry in the history, and the best checkpoint and early stopping decided on it."""
        self.progress.pause()
        found = {f"eval_{k}": v for k, v in self.evaluate().items()}
        metrics = {"epoch": self.pos.epoch + 1, "step": self.pos.global_step, **found}
        self.result.history.append(metrics)
        self.progress.eval_line(self.pos.global_step, {k[5:]: v for k, v in found.items()})
        self._select(metrics, Position(self.pos.epoch, self.pos.step_in_epoch, self.pos.global_step,
                                       self._epoch_loss()))
        self.progress.resume()

    def _log_samples(self) -> None:
        """train.log_samples: rank 0 appends the step's digest of its samples (sampling.py),
        after a line that marks each attempt: a continued run redoes the steps after its
        checkpoint, and the rows after the mark are the ones its weights come from.

        Example:
            # attempt 2: from step 6 on 1 rank(s), continuing checkpoint ckpt_000000005
            6\t2\t2\t9f2c41d07a3e5b18
        """
        if not (self.cfg.train.log_samples and self.run_dir and self.sampler is not None):
            return
        if self.env.is_main or getattr(self.sampler, "gathers", False):   # a stream's: every rank's items
            digest = self.sampler.step_digest(self.pos.step_in_epoch - 1)
        if self.env.is_main:
            # Set here, not in __init__: only this method writes the file.
            mark, self.samples_marked = not self.samples_marked, True
            with open(Run(self.run_dir).samples, "a+", opener=private.nofollow) as out:
                if mark:           # the earlier attempts' marks, read through the same refusal of links
                    out.seek(0)
                    attempts, resumed = out.read().count("# attempt "), self.result.resumed_from
                    out.write(f"# attempt {attempts + 1}: from step {self.pos.global_step} on "
                              f"{self.env.world_size} rank(s), "
                              f"{f'continuing checkpoint {Path(resumed).name}' if resumed else 'a new run'}\n")
                out.write(f"{self.pos.global_step}\t{self.pos.epoch + 1}\t{self.pos.step_in_epoch}\t{digest}\n")

    def _save_mid_epoch(self) -> None:
        """A checkpoint inside an epoch also keeps the losses of its steps so far (summed
        over the ranks: one all-reduce), for the epoch's train loss after a resume."""
        self.save(Position(self.pos.epoch, self.pos.step_in_epoch, self.pos.global_step,
                           self._epoch_loss()))

    def _epoch_loss(self) -> Tuple[float, float, Dict[str, float]]:
        """(sum, count, {part: sum}) of the epoch's step losses and their parts so far, an
        earlier attempt's included (that attempt may have had another number of ranks): a
        step's loss is its loss over every rank (weighting.py), each weighed by its count
        for a loss with one (the sum is then Σ sums, the count Σ counts), else counted once;
        the parts, each rank's, are averaged over the ranks here in one all-reduce."""
        total, weight, parts = self.ledger.epoch_totals()
        names = sorted(parts)
        summed = all_reduce_sum([total, weight, *(parts[k] for k in names)], self.env,
                                self.monitor.phase) / self.env.world_size
        total, n, named = float(summed[0]), float(summed[1]), dict(zip(names, map(float, summed[2:])))
        if self.pos.epoch == self.resumed_epoch:
            before = dict(self.pos_loss[2]) if len(self.pos_loss) > 2 else {}
            total, n = total + self.pos_loss[0], n + self.pos_loss[1]
            named = {k: named.get(k, 0.0) + before.get(k, 0.0) for k in sorted({*named, *before})}
        return total, n, named

    def end_epoch(self, epoch: int) -> Dict[str, Any]:
        """Global train loss (and its parts), exact evaluation, history, epoch-end checkpoint."""
        self.progress.pause()
        total, n, named = self._epoch_loss()
        metrics: Dict[str, Any] = {"epoch": epoch + 1, "train_loss": float(total / max(n, 1)),
                                   **{f"train_{k}": v / max(n, 1) for k, v in named.items()}}
        if self.ledger.counted:        # a token loss: its perplexity over the epoch, exp(loss)
            metrics["train_perplexity"] = perplexity(metrics["train_loss"])
        # paddle.Model's order: the epoch's end, then its evaluation.
        self.events.epoch_end(epoch, {"loss": [metrics["train_loss"]], "lr": float(self.optimizer.get_lr()),
                                      **{k: [v / max(n, 1)] for k, v in named.items()}})
        if self.parts.eval_data is not None and not self.cfg.train.eval_every_steps:
            metrics.update({f"eval_{k}": v for k, v in self.evaluate().items()})
        self.result.history.append(metrics)
        self.progress.epoch_end(epoch, metrics["train_loss"],
                                {k[5:]: v for k, v in metrics.items() if k.startswith("eval_")},
                                {**{k: v / max(n, 1) for k, v in named.items()},
                                 **({"perplexity": metrics["train_perplexity"]} if self.ledger.counted else {})})
        if epoch == self.resumed_epoch and self.env.is_main and self.engine.sync.mode != "dataparallel":
            untrained.warn(self.parts.model, self.engine.sync.tables.rows)      # the job's first epoch
        self.step_scheduler("epoch")
        every = self.cfg.checkpoint.every_epochs
        at = Position(epoch=epoch + 1, global_step=self.pos.global_step)
        if every and (epoch + 1) % every == 0:
            self.save(at)
        self._select(metrics, at)
        self.progress.resume()
        return metrics

    def evaluate(self) -> Dict[str, Any]:
        """The exact evaluation of the test set, between the callbacks' eval begin and end."""
        parts, cfg = self.parts, self.cfg
        names = ["loss", *metric_names(parts.metrics)]
        # A stream's rounds are known at its end only (evaluation.py): hapi's None, "unknown".
        rounds = None if parts.eval_data.stream else \
            exchange_rounds(len(parts.eval_data), cfg.train.eval_batch_size, self.env.world_size)
        self.events.eval_begin({"steps": rounds, "metrics": names})
        with self.ema.applied() if self.ema is not None else contextlib.nullcontext():
            # What each rank evaluates with, its callbacks' swaps included, must be one model.
            agreement.check_evaluated(parts.model, self.env, self.pos.global_step, self.monitor.phase)
            found = evaluate(EvalSetup.of(parts, cfg, amp=self.engine.precision, beat=self.monitor.beat,
                                          phase=self.monitor.phase, events=self.events or None), self.env)
        self.events.eval_end(hapi_logs(found, ""))
        return found

    def step_scheduler(self, when: str) -> None:
        """Step the optimizer's own LRScheduler if train.scheduler_every is `when` (step:
        after every optimizer step, never per micro-batch; epoch: after every epoch), the
        rule of hapi's `paddle.callbacks.LRScheduler(by_step, by_epoch)`. Called before any
        checkpoint of that step or epoch is taken, so a resumed run (the scheduler's state
        is in the optimizer's state_dict) continues the schedule where it stood.

        Example:
            session.step_scheduler("epoch")     # at an epoch's end
        """
        if self.scheduler is not None and self.cfg.train.scheduler_every == when:
            self.scheduler.step()

    def _select(self, metrics: Dict[str, Any], at: Position) -> None:
        """Best checkpoint, early stopping and a callback's stop, decided alike on every rank
        in one all-reduce: rank 0's monitored value, and whether any rank's callbacks set
        `model.stop_training` (EarlyStopping's, a user's), which ends the run after this epoch."""
        value = metrics.get(self.best.monitor)
        # Not logged, or a metric of several values: nothing to select (the same on every rank).
        monitored = isinstance(value, (int, float))
        wanted = 1.0 if self.events.view.stop_training else 0.0
        agreed, stop = all_reduce_sum([value if monitored and self.env.is_main else 0.0, wanted],
                                      self.env, self.monitor.phase)
        if monitored:
            improved = self.best.update(dict(metrics, **{self.best.monitor: float(agreed)}))
            if improved and self.cfg.checkpoint.save_best and self.run_dir:
                self.save(at, Run(self.run_dir).best, keep_last=1)
            if self.best.should_stop and not self.done:
                self.progress.log.info(f"early stop after {_when(at)}: no better {self.best.monitor} in "
                                       f"{self.best.stale} evaluations ({self.best.describe()})")
                self.limit = self.pos.global_step
        if stop and not self.done:
            self.progress.log.info(f"a callback stopped training after {_when(at)}")
            self.limit = self.pos.global_step

    def save(self, at: Position, root: Optional[Path] = None, keep_last: Optional[int] = None) -> None:
        """Rank 0 snapshots the state now and writes it in the background: no other rank
        ever waits inside a collective while the files are written. `root`: where
        (default <run>/checkpoints). Every rank calls it: first the ranks check that
        their weights agree (check_weights), so a checkpoint never keeps diverged ones."""
        self.check_weights(at.global_step)
        stream = self.sampler.position(at.global_step)     # a stream's lanes: gathered on every rank
        if not (self.env.is_main and self.run_dir):
            return
        averaged = self.ema.weights() if self.ema is not None else None
        snap = checkpoint.snapshot(self.parts.model, self.optimizer, self.meta(at, stream), averaged)
        self.saver.submit(root or Run(self.run_dir).checkpoints, snap,
                          self.cfg.checkpoint.keep_last if keep_last is None else keep_last,
                          before_write=self.monitor.save_delay(at.global_step))
        what = "best checkpoint" if root is not None else "checkpoint"
        self.progress.log.info(f"{what} for step {at.global_step} is being written")

    def _say_written(self, written) -> None:
        """Rank 0's line as a checkpoint's write ends (in the writer's thread): its size and
        how long the write took, `checkpoint for step 40 written: 12.3 MB in 0.21 s`."""
        best = self.run_dir is not None and written.path.parent == Run(self.run_dir).best
        self.progress.log.info(written.line("best checkpoint" if best else "checkpoint"))

    def meta(self, at: Position, stream: Optional[Dict[str, Any]] = None) -> Meta:
        """The checkpoint's record of the run at `at`: every piece that survives a resume
        gives its state (state.py); `stream`: a stream's lanes (streamplan.py)."""
        scaler = self.engine.scaler       # float16: resumed at the scale it had reached
        return Meta(global_step=at.global_step, epoch=at.epoch, step_in_epoch=at.step_in_epoch,
                    world_size=self.env.world_size, model=self.parts.name, api=self.cfg.train.api,
                    config_hash=self.config_hash, history=tuple(self.result.history),
                    plan_world=self.plan.world, plan_accumulate=self.plan.accumulate,
                    epoch_loss=tuple(at.epoch_loss) if at.step_in_epoch else (),
                    ema_updates=self.ema.updates if self.ema is not None else None,
                    loss_scaler=amp_scaler_state(scaler) if scaler is not None else None, stream=stream)

    def check_weights(self, step: int) -> None:
        """The ranks compare their weights (agreement.check: one collective), once a step:
        an epoch's end may save twice (its checkpoint and the best one). Raises
        errors.Diverged when they differ."""
        if self.checked_at != step:
            self.checked_at = step
            agreement.check(self.parts.model, self.env, step, self.monitor.phase,
                            self.ema.shadow if self.ema is not None else None, self.engine.sync.tables.explain)

    def _stop_for_preemption(self) -> None:
        self._save_mid_epoch()
        self.saver.wait()
        self.progress.log.info(f"stop requested: checkpoint saved at step {self.pos.global_step}; "
                               "exiting so the job can be requeued")
        raise Preempted(f"stopped on request at step {self.pos.global_step}")

    def close(self) -> None:
        self.saver.close()


def _ema(model, cfg: Config, resumed: Resumed, log) -> Optional[Ema]:
    """train.ema_decay's averages, going on where a resumed run's stood."""
    if not cfg.train.ema_decay:
        return None
    ema = Ema(model, cfg.train.ema_decay, cfg.train.ema_warmup)
    if resumed.averaged:
        ema.load(resumed.averaged, resumed.ema_updates)
    elif resumed.path:
        log.warning(f"checkpoint {resumed.path} holds no moving averages (train.ema_decay was off): "
                    "they start from its weights")
    return ema


def _when(at: Position) -> str:
    return f"step {at.global_step}" if at.step_in_epoch else f"epoch {at.epoch}"


