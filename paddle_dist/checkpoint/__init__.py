"""One checkpoint format for both trainers: the full training state, written by global rank 0.

- format: what a checkpoint holds (layout, State, Snapshot, Meta: meta.json as a record, Written,
  RNG state) and its checks;
- io: snapshot, atomic write, the background AsyncSaver, latest, load, export to .pdparams;
- resume: which checkpoint `checkpoint.resume` means, compatibility, restore;
- weights: load_weights, weights into a model exactly or a one-line refusal (also restore's);
- __main__: `python -m paddle_dist.checkpoint show | export`.

Loading never unpickles (npz with `allow_pickle=False`, JSON meta), so a checkpoint can
never run code; load_weights reads a .pdparams pickle with an unpickler that builds arrays
and plain values only.

Example:
    meta = {"global_step": 120, "epoch": 1, "step_in_epoch": 20, "world_size": 2, "model": "mlp"}
    saver = AsyncSaver()
    saver.submit(run_dir / "checkpoints", snapshot(net, opt, meta), keep_last=3)
    ...                                     # training goes on meanwhile
    saver.wait()                            # re-raises a failed write
    state = load(run_dir / "checkpoints")   # the newest
    check_compatible(state, world_size=2, model_name="mlp", model=net)
    restore(state, net, opt)
    load_weights(my_net, run_dir / "best")  # weights only, into a model of your own; or a .pdparams
"""

from ..runs.layout import LATEST
from .format import (FIX, FORMAT, CheckpointError, Meta, Snapshot, State, apply_rng, capture_rng,
                     weights_digest)
from .io import AsyncSaver, export_pdparams, latest, load, save, snapshot, write
from .resume import check_compatible, resolve_resume, restore
from .weights import load_weights

__all__ = ["FIX", "FORMAT", "LATEST", "AsyncSaver", "CheckpointError", "Meta", "Snapshot", "State", "apply_rng",
           "capture_rng", "check_compatible", "export_pdparams", "latest", "load", "load_weights",
           "resolve_resume", "restore", "save", "snapshot", "weights_digest", "write"]
