"""`paddle.callbacks.Callback`s at both API levels, called as paddle.Model calls them.

The Session calls them at the same points whichever trainer runs: train, epoch, batch and
eval begin and end, with hapi's `logs` (`loss` as a one-item list, each metric by its
name, `batch_size`). A train batch is one optimizer step (with train.accumulate_steps=k,
one call per k micro-batches). Callbacks run on every rank; the logs are the same on
every rank except a train batch's loss, which is that rank's own (as under
paddle.Model). `self.model` is a `ModelView`: the network, the optimizer, `save()` and
`stop_training`, which ends the run at the epoch's end once any rank sets it. The calls
come in paddle.Model's order: an epoch's end, then its evaluation.

Example:
    events = Events([paddle.callbacks.EarlyStopping("miou", mode="max", patience=2)], view, params)
    events.train_begin()
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import paddle

from ..errors import ConfigError


class ModelView:
    """What Paddle's callbacks reach through `self.model`: `network`, `_optimizer`,
    `stop_training`, `save(path, training=True)` (on the job's first rank: the weights are
    the same on every rank), `parameters()` and `state_dict()`."""

    def __init__(self, network: paddle.nn.Layer, optimizer, saves: bool = True):
        self.network, self._optimizer, self.saves = network, optimizer, saves
        self.stop_training = False

    def save(self, path: str, training: bool = True) -> None:
        if not self.saves:
            return
        paddle.save(self.network.state_dict(), f"{path}.pdparams")
        if training and self._optimizer is not None:
            paddle.save(self._optimizer.state_dict(), f"{path}.pdopt")

    def parameters(self, *args, **kwargs):
        return self.network.parameters(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        return self.network.state_dict(*args, **kwargs)


class Events:
    """The user's callbacks, called in order."""

    def __init__(self, callbacks: Sequence, view: ModelView, params: Dict[str, Any]):
        self.callbacks = check(callbacks)
        self.view = view
        for callback in self.callbacks:
            callback.set_model(view)
            callback.set_params(dict(params))

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def steps_scheduler(self) -> bool:
        """True when one of them is Paddle's LRScheduler callback: it steps the optimizer's
        LRScheduler by its own rule (by_step: after every optimizer step), and the
        Session's train.scheduler_every rule stands aside."""
        return any(isinstance(c, paddle.callbacks.LRScheduler) for c in self.callbacks)

    def _call(self, name: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, name)(*args)

    def train_begin(self, logs: Optional[dict] = None) -> None:
        self._call("on_train_begin", logs or {})

    def train_end(self, logs: Optional[dict] = None) -> None:
        self._call("on_train_end", logs or {})

    def epoch_begin(self, epoch: int) -> None:
        self._call("on_epoch_begin", epoch, {})

    def epoch_end(self, epoch: int, logs: dict) -> None:
        self._call("on_epoch_end", epoch, logs)

    def batch_begin(self, step: int) -> None:
        self._call("on_train_batch_begin", step, {})

    def batch_end(self, step: int, logs: dict) -> None:
        self._call("on_train_batch_end", step, logs)

    def eval_begin(self, logs: dict) -> None:
        self._call("on_eval_begin", logs)

    def eval_batch_begin(self, step: int) -> None:
        self._call("on_eval_batch_begin", step, {})

    def eval_batch_end(self, step: int, logs: dict) -> None:
        self._call("on_eval_batch_end", step, logs)

    def eval_end(self, logs: dict) -> None:
        self._call("on_eval_end", logs)


def check(callbacks) -> List:
    """The callbacks as a list; anything that is not a paddle.callbacks.Callback is refused."""
    if callbacks is None:
        return []
    found = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    for callback in found:
        if not isinstance(callback, paddle.callbacks.Callback):
            raise ConfigError(f"fit(callbacks=...) takes paddle.callbacks.Callback objects, "
                              f"not {type(callback).__name__}")
    return found


def hapi_logs(metrics: Dict[str, Any], prefix: str) -> Dict[str, Any]:
    """A history entry's `prefix` metrics as hapi logs them: `loss` as a one-item list,
    every other metric by its own name."""
    logs: Dict[str, Any] = {}
    for key, value in metrics.items():
        if key.startswith(prefix) and key != f"{prefix}count":
            name = key[len(prefix):]
            logs[name] = [value] if name == "loss" else value
    return logs
