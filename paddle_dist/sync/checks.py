"""What is settled before the first step, and how often the ranks check for a stop.

- the mode `sync.mode` runs as on this device (`resolve_mode`);
- the exchange's layout: the optimizer's trainable parameters (`trainable`), which every
  rank must have alike, names, shapes and dtypes (`agree_on_layout`, `layout_mismatch`);
- what the exchange cannot serve exactly, refused up front (`check_optimizer`);
- sync.mode=dataparallel: how many steps apart the stop flag travels (`stop_check_interval`).

Example:
    check_optimizer(optimizer, net, cfg.sync.mode)
    agree_on_layout(optimizer, net, env)   # collective: every rank, before anything starts
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

import paddle
import paddle.distributed as dist

from .collectives import collective
from ..errors import ConfigError

if TYPE_CHECKING:     # runtime/ is above this module (docs/architecture.md)
    from ..runtime.env import DistEnv

# sync.mode=dataparallel: the stop flag needs an all-reduce of its own, so the ranks
# exchange it about once every STOP_CHECK_S seconds (and at most STOP_CHECK_MAX steps
# apart): an extra collective at every step would cost a small model several percent.
STOP_CHECK_S = 1.0
STOP_CHECK_MAX = 1000


def resolve_mode(mode: str, device: str, compress: str = "none", bucket_mb: float = 0.0,
                 transport: str = "auto") -> str:
    """sync.mode as it runs on `device`: `auto` on a GPU is Paddle's own reducer
    (`dataparallel`), unless an option only paddle_dist's exchange has is set
    (sync.compress, bucket_mb, transport), which keeps auto's own choice; every other
    case is unchanged.

    Example:
        resolve_mode("auto", "gpu:0")                    # 'dataparallel'
        resolve_mode("auto", "cpu")                      # 'auto' (fused or overlap at attach)
        resolve_mode("auto", "gpu:0", compress="bf16")   # 'auto'
    """
    own_options = compress != "none" or bool(bucket_mb) or transport != "auto"
    if mode == "auto" and device.startswith("gpu") and not own_options:
        return "dataparallel"
    return mode


def stop_check_interval(seconds_per_step: float) -> int:
    """Steps between two stop-flag exchanges: about STOP_CHECK_S seconds' worth."""
    if seconds_per_step <= 0:
        return STOP_CHECK_MAX
    return max(1, min(STOP_CHECK_MAX, round(STOP_CHECK_S / seconds_per_step)))


def trainable(optimizer) -> list:
    """The optimizer's trainable parameters, every parameter group's, each once, in order."""
    params = optimizer._parameter_list
    if params and isinstance(params[0], dict):
        params = [p for group in params for p in group["params"]]
    seen, out = set(), []
    for p in params:
        if not p.stop_gradient and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def agree_on_layout(optimizer, net, env: DistEnv) -> None:
    """Before anything starts (collective, one all-gather): the exchange's layout (the
    optimizer's trainable parameters: names, shapes and dtypes, in order) and `net`'s whole
    state (what buffer averaging and the weights check exchange) must be the same on every
    rank; else a ConfigError naming the first parameter that differs and the ranks."""
    if not env.is_distributed:
        return
    names = {id(p): name for name, p in net.named_parameters()}

    def entry(name, tensor):
        return name, list(tensor.shape), str(tensor.dtype).replace("paddle.", "")

    mine = [[entry(names.get(id(p), p.name), p) for p in trainable(optimizer)],
            [entry(name, t) for name, t in net.state_dict().items()]]
    found: list = []
    collective(dist.all_gather_object, found, mine, what="parameter layout check")
    for index in (0, 1):
        problem = layout_mismatch([layouts[index] for layouts in found])
        if problem:
            raise ConfigError(f"the ranks' models differ: {problem}; every rank must build the same "
                              "model and optimizer (a rank-dependent layer, freeze or parameter group?)")


def layout_mismatch(layouts: List[list]) -> str:
    """'' when every rank's list of (name, shape, dtype) is the same; else where the first
    difference is, naming the parameter and the ranks.

    Example:
        layout_mismatch([[("w", [2], "float32")], [("w", [3], "float32")]])
        # "parameter 'w' is [2] float32 on rank 0 but [3] float32 on rank 1"
    """
    def text(entry):
        return f"{entry[1]} {entry[2]}" if entry is not None else "absent"

    for i in range(max(len(layout) for layout in layouts)):
        entries = [tuple(map(str, layout[i])) if i < len(layout) else None for layout in layouts]
        if len(set(entries)) > 1:
            first = entries[0]
            other = next(r for r, e in enumerate(entries) if e != first)
            name = (first or entries[other])[0]
            if first is not None and entries[other] is not None and first[0] != entries[other][0]:
                return (f"trainable parameter {i} is '{first[0]}' {text(first)} on rank 0 but "
                        f"'{entries[other][0]}' {text(entries[other])} on rank {other}")
            return f"parameter '{name}' is {text(first)} on rank 0 but {text(entries[other])} on rank {other}"
    return ""


def check_optimizer(optimizer, net=None, mode: str = "auto") -> None:
    """Refuse, before anything starts, what this averaging cannot serve exactly."""
    if isinstance(optimizer, getattr(paddle.optimizer, "LBFGS", ())):
        raise ConfigError("paddle.optimizer.LBFGS evaluates the loss and its gradients again inside "
                          "step(closure), which data parallelism cannot average; use another optimizer")
