"""The high-level path: `paddle.Model.prepare` / `fit`, unchanged.

`paddle.Model` wraps the network in `DataParallel` itself (never wrap it twice). It is
handed a DataLoader over the same resumable distributed sampler as the loop trainer, so
both API levels see the same shards in the same order and resume mid-epoch alike (a
plain, unsharded DataLoader would make every rank train on all the data). Progress,
exact evaluation, checkpoints, stop requests and the lr policy run through one callback;
gradient accumulation is hapi's own (`accumulate_grad_batches`). hapi's own stepping of
the optimizer's LRScheduler is switched off: the Session steps it, by the same rule as
the loop (train.scheduler_every).
"""

from __future__ import annotations

import contextlib
from typing import Optional, Tuple

import paddle
from paddle.static import InputSpec

from .amp import install_autocast
from ..runtime.process import quiet_paddle
from ..sync.wiring import building
from .engine import Engine
from .session import Session
from .feed import Feed, to_float, widened
from .keywords import ByName, Named
from .weighting import Weighting
from ..runtime.env import DistEnv


class _Bridge(paddle.callbacks.Callback):
    """hapi's callbacks -> the shared Session. With train.accumulate_steps = k, hapi calls
    back after every micro-batch and steps the optimizer after every k-th (and the epoch's
    last): the session sees optimizer steps only, with the step's loss over every rank
    (the engine's weighting.py, which the optimizer's average completed)."""

    def __init__(self, session: Session, sampler, loss: "_GroupMean"):
        super().__init__()
        self.session, self.sampler, self.loss = session, sampler, loss
        self.first = session.pos.epoch
        self.k = session.cfg.train.accumulate_steps
        self.group_parts = []               # the parts of the group's losses

    def on_epoch_begin(self, epoch, logs=None):
        real = self.first + epoch          # hapi counts the epochs of this fit() call
        done = self.session.pos.step_in_epoch if epoch == 0 else 0
        self.sampler.start(real, done)
        self.session.begin_epoch(real)
        self.group_parts = []

    def on_train_batch_begin(self, step, logs=None):
        # Mode dataparallel: Paddle's all-reduces run inside hapi's train_batch, unseen; it
        # is marked as this rank's wait in one (GradSync.in_backward), until the batch ends.
        self.marked = self.session.engine.sync.in_backward()
        self.marked.__enter__()
        if step % self.k == 0:
            self.session.before_step()
            # Each micro-batch's loss is divided by its group's size, so the summed
            # gradient is that of the group's mean loss (the epoch's last group may be
            # short); a loss with a count gives its sum (weighting.py).
            self.loss.divisor = min(self.k, len(self.sampler) - step)
        self.session.seed_micro_batch(step % self.k, self.loss.divisor)
        if self.k > 1:       # only the group's last backward() sends gradients (overlap)
            self.session.engine.sync.arm((step + 1) % self.k == 0 or step + 1 == len(self.sampler))

    def on_train_batch_end(self, step, logs=None):
        self.marked.__exit__(None, None, None)
        # hapi has read the loss on the host already. Its logs hold numpy, whose bfloat16
        # arrays are the bits (uint16): the parts are read from the tensors.
        self.group_parts.append({k: to_float(v) for k, v in self.loss.last_parts.items()})
        if (step + 1) % self.k and step + 1 != len(self.sampler):
            return                          # hapi accumulates: no optimizer step yet
        count = len(self.group_parts)
        parts = {k: sum(p[k] for p in self.group_parts) / count for k in self.group_parts[0]}
        self.group_parts = []
        weighting = self.session.engine.weighting      # the step's loss, over every rank
        if self.session.after_step(weighting.loss, parts, weighting.count, weighting.local):
            # The step limit: hapi leaves its batch loop when num_iters runs out, which it
            # checks right after this callback.
            self.model.num_iters = 1

    def on_epoch_end(self, epoch, logs=None):
        self.session.end_epoch(self.first + epoch)
        if self.session.done:          # early stop (hapi checks this after every epoch)
            self.model.stop_training = True


class _GroupMean:
    """The loss divided by the number of micro-batches in the current group, or its sum
    for a loss with a count (the engine's `weighting`, which records each micro-batch).
    paddle.Model calls it with the outputs and the labels; `feed` makes it the loss fit()
    was given (or the model's own). `fields`: a training batch's counts of inputs and
    labels (firstbatch), `names` their names when they go to forward by name. The last
    loss's parts are kept for the bridge, which owns this object."""

    def __init__(self, loss, feed: Feed, fields: Optional[Tuple[int, int]], weighting: Weighting,
                 names: Tuple[str, ...] = ()):
        self.inner, self.feed, self.divisor, self.weighting = loss, feed, 1, weighting
        self.inputs, labels = fields or (0, 0)
        self.labels = labels if not feed.model_loss else 0
        self.names = names
        self.handed: tuple = ((), [])   # loss="model": the inputs and labels the network got (`see`)
        self.last_parts = {}

    def see(self, layer, args) -> None:
        """The network's forward pre-hook when a model with its own loss has its labels
        counted (train.loss_count=labels): they reach the network, not this loss."""
        given = Named(args, self.names) if len(self.names) == len(args) else list(args)
        self.handed = (given, list(args[self.inputs:]))

    def __call__(self, *args):
        cut = len(args) - self.labels
        inputs, labels = self.handed if self.feed.model_loss else ((), list(args[cut:]))
        loss, parts, count = self.feed.counted_loss(self.inner, list(args[:cut]), labels,
                                                    self.weighting.ignore_index, inputs)
        self.last_parts = parts     # read as numbers by the bridge (never bf16 bits)
        return self.weighting.add(loss, count, self.divisor)


def run(session: Session) -> None:
    with quiet_paddle():
        _fit(session)


def prepared_model(engine: Engine, loss, inputs: int = 1, names: Tuple[str, ...] = ()) -> paddle.Model:
    """The engine's network in a prepared paddle.Model as the hapi trainer runs it (the
    self-test's hapi rows run it too): paddle.Model's DataParallel as sync.wrap builds it
    (Paddle's reducer only for sync.mode=dataparallel, sync/wiring.py), the optimizer already
    averaging (GradSync attached), the plan's autocast in the network's forward hooks, and
    the engine's scaler (amp.SyncedScaler) as hapi's loss scaler. `inputs`: the count of
    the network's inputs, by which paddle.Model splits a batch; `names`: what the network
    calls them, when a dict batch's fields go to it by name (keywords.ByName)."""
    net, optimizer, env, sync = engine.net, engine.optimizer, engine.env, engine.sync
    precision, scaler = engine.precision, engine.scaler
    specs = [InputSpec([None], name=f"input{i}") for i in range(inputs)]
    with building(sync) if env.is_distributed else contextlib.nullcontext():
        # paddle.Model calls its network by position: ByName calls net with the names.
        model = paddle.Model(ByName(net, names) if names else net, inputs=specs)
    # hapi's own autocast knows float16 O1 only: the plan's autocast runs in the network's
    # forward hooks, and hapi's AMP level is used just for its loss-scaling path (float16).
    scaling = {"level": "O1", "init_loss_scaling": precision.loss_scale} if scaler else None
    # paddle.Model computes the loss outside autocast, on the outputs as the network hands
    # them out (16-bit at O2): it gets them widened to float32, as the loop's Feed gives them.
    model.prepare(optimizer=optimizer, loss=lambda *args: loss(*widened(list(args))), amp_configs=scaling)
    if scaler is not None:
        model._scaler = scaler          # checks the averaged gradients (amp.SyncedScaler)
    install_autocast(net, precision)
    return model


def _fit(session: Session) -> None:
    cfg, fields = session.cfg, session.first.fields
    feed = session.parts.feed
    weighting = session.engine.weighting
    loss = _GroupMean(session.parts.loss, feed, fields, weighting, session.first.names)
    # paddle.Model splits a batch by the count of its inputs: the feed's split (the loader
    # yields (inputs, labels), which paddle.Model flattens) hands the network the same fields.
    model = prepared_model(session.engine, loss, feed.hapi_inputs(fields), session.first.names)
    if feed.model_loss and weighting.ignore_index is not None:     # its labels are counted where they go
        model.network.register_forward_pre_hook(loss.see)
    loader, sampler = session.loader, session.sampler
    # Without an LRScheduler callback, Model.fit adds LRScheduler(by_step=True), which steps
    # after every micro-batch (config_callbacks in paddle/hapi/callbacks.py): this one,
    # stepping neither by step nor by epoch, keeps it out (Paddle 2.6 to 3.3).
    model.fit(loader, epochs=cfg.train.epochs - session.pos.epoch, verbose=0,
              accumulate_grad_batches=cfg.train.accumulate_steps,
              callbacks=[_Bridge(session, sampler, loss),
                         paddle.callbacks.LRScheduler(by_step=False, by_epoch=False)])
