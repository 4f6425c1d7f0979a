"""The parameters a job never trains: trainable, yet no rank gave them a gradient in the
whole first epoch of the job.

The gradient exchange gives a parameter's gradient to every rank when any rank has one
(sync/grad_sync.py), and Paddle's clear_grad only zeroes a gradient that exists, so at
the end of the first epoch a trainable parameter whose gradient is still None had none
on any rank at any step. Such a parameter keeps its initial value for the whole run,
silently: a branch the loss never reaches, or layers under Paddle's `recompute` in its
reentrant mode, whose inputs need no gradient (a frozen stem before a recomputed
backbone). Rank 0 names them in one warning line. (In sync.mode=dataparallel Paddle's
reducer may fill unused gradients with zeros: nothing is named there.) A sparse table's
gradient (rows, sync/sparse.py) is released by clear_grad: its None says nothing.

Example:
    line = never_trained(net)    # '' or 'trainable parameters got no gradient ...'
"""

from __future__ import annotations

import logging
from typing import List

import paddle

SHOWN = 4           # names in the line; the rest are counted


def never_trained(net: paddle.nn.Layer, tables=()) -> str:
    """The warning line for `net`'s trainable parameters without a gradient now (at the
    end of the first epoch), or "" when every one has one; `tables` (sparse ones) aside."""
    aside = {id(p) for p in tables}
    names: List[str] = [name for name, p in net.named_parameters()
                        if not p.stop_gradient and p.grad is None and id(p) not in aside]
    if not names:
        return ""
    total = sum(1 for p in net.parameters() if not p.stop_gradient)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return (f"{len(names)} of {total} trainable parameters got no gradient on any rank in the whole "
            f"first epoch, so they keep their initial values: {', '.join(names[:SHOWN])}{more}. Check "
            "that the loss depends on them; layers run under paddle.distributed.fleet.utils.recompute "
            "whose inputs need no gradient get none (pass use_reentrant=False), and parameters meant "
            "to stay fixed should have stop_gradient=True")


def warn(net: paddle.nn.Layer, tables=()) -> None:
    """Log never_trained(net, tables)'s line, if any, as a warning."""
    line = never_trained(net, tables)
    if line:
        logging.getLogger("paddle_dist").warning(f"paddle_dist: {line}")
