"""From a trained run to an inference model: `python -m paddle_dist.export RUN_OR_CHECKPOINT`.

Writes, with `paddle.jit.save`, a static inference model for Paddle Inference (C++ or
Python) and FastDeploy, and beside it `deploy.json`: what a deployer needs to feed it
(input name and shape, layout, colour, scaling, mean and std) and to read its output
(class names). The batch size is left dynamic. Optimizer state is not exported.

    <out>/model.json        the program (Paddle 3's PIR format; model.pdmodel from 2.6)
    <out>/model.pdiparams   the weights
    <out>/deploy.json       input and preprocessing, class names, where it came from

Which weights: of a run directory, `best/` when it has one, else its latest checkpoint; or
exactly the checkpoint (a ckpt_* directory, or a checkpoints/ or best/ root) given. The
model and data come from the run's config.yaml (`-c` for a checkpoint kept elsewhere).

For your own model, the Python API does the same (this module is callable):
    paddle_dist.export(net, [InputSpec([None, 3, 64, 64], "float32", "image")], "out/")

`python -m paddle_dist.checkpoint export RUN model.pdparams` is the other way out of a run:
the weights alone, for `paddle_dist.checkpoint.load_weights(net, "model.pdparams")` in Python,
which refuses a model whose parameter names or shapes differ (as `export_run` does here).

Example:
    $ python -m paddle_dist.export runs/mnist_lenet-20261123-061500
    paddle_dist: exported runs/mnist_lenet-20261123-061500/best/ckpt_000000315 to runs/mnist_lenet-20261123-061500/export
"""

from __future__ import annotations

import dataclasses

import json
import os
import shutil
import sys
import types
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import compat
from . import config as configlib
from .errors import UserError
from .options import ArgParser, run
from .data import registry
from .runs.layout import EXPORT, Run

PROG = "python -m paddle_dist.export"
DEPLOY_FILE = "deploy.json"
MODEL_PREFIX = "model"
INPUT_NAME = "image"


def export(net, input_spec: Sequence, out, info: Optional[Dict[str, Any]] = None) -> Path:
    """Save `net` for inference in directory `out` (which must not exist yet, or be empty):
    model.json and model.pdiparams from paddle.jit.save, and deploy.json holding `info`
    plus the input spec. Written under a temporary name and renamed: a failure leaves
    nothing behind.

    Example:
        export(net, [paddle.static.InputSpec([None, 1, 28, 28], "float32", "image")], "out")
    """
    import paddle

    out = check_out(Path(out))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir()
    except OSError as exc:
        raise UserError(f"cannot write to {out} ({exc.strerror or exc}); choose a writable directory") from None
    try:
        was_training = net.training
        net.eval()
        try:
            paddle.jit.save(net, str(tmp / MODEL_PREFIX), input_spec=list(input_spec))
        finally:
            if was_training:
                net.train()
        inputs = [{"name": spec.name, "shape": [-1 if d is None else int(d) for d in spec.shape],
                   "dtype": str(spec.dtype).replace("paddle.", "")} for spec in input_spec]
        deploy = {"format": 1, "model_file": compat.program_file(tmp, MODEL_PREFIX).name,
                  "params_file": f"{MODEL_PREFIX}.pdiparams", "inputs": inputs, **(info or {})}
        (tmp / DEPLOY_FILE).write_text(json.dumps(deploy, indent=1))
        if out.exists():
            out.rmdir()              # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_out(out: Path) -> Path:
    """`out`, if export can make it: it must not exist (or be an empty directory), and the
    nearest directory above it that exists must be writable. Checked before any work."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists; choose another output directory or remove it")
    above = out.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
        reason = "not a directory" if above.exists() and not above.is_dir() else "not writable"
        raise UserError(f"cannot write to {out} ({above} is {reason}); choose a writable directory")
    return out


def export_run(target: Path, out: Optional[Path] = None, config: Optional[str] = None) -> Path:
    """Export a run's (or one checkpoint's) weights; returns the output directory."""
    from paddle.static import InputSpec

    from . import checkpoint, models

    checkpoint_dir, run_dir = _locate(Path(target))
    if not config and run_dir is None:
        raise UserError(f"no config.yaml beside checkpoint {checkpoint_dir}; give the run's config with -c")
    if not config:
        record = configlib.fit_record(Run(run_dir).config)
        if record is not None:
            raise UserError(configlib.refuse_fit_run(
                run_dir, record, "python -m paddle_dist.export rebuilds only built-in models: export "
                f"yours from the script, paddle_dist.checkpoint.load_weights(net, '{run_dir}') then "
                "paddle_dist.export(net, input_spec, out) (docs/deploy.md)"))
    cfg = configlib.load(config or str(Run(run_dir).config))
    classes = _classes(run_dir) if registry.get(cfg.data.name).classes_in_run else None
    net = models.build(cfg.model.name, cfg.model.num_classes or len(classes or ()))
    state = checkpoint.load(checkpoint_dir)
    if state.averaged:          # train.ema_decay: the moving averages are what was evaluated
        state = dataclasses.replace(state, model=state.averaged)
    checkpoint.restore(state, net, rng=False)     # exactly, or refused in one line
    info = registry.preprocessing(cfg, classes)
    spec = InputSpec([None, *info.pop("input_shape")], "float32", INPUT_NAME)
    info = {"model": cfg.model.name, "task": models.task_of(cfg.model.name), **info,
            "checkpoint": str(checkpoint_dir.resolve()), "global_step": state.record.global_step,
            "eval_accuracy": (state.record.history or ({},))[-1].get("eval_accuracy")}
    out = Path(out) if out else (Run(run_dir).export if run_dir else checkpoint_dir / EXPORT)
    return export(net, [spec], out, info)


def _classes(run_dir: Optional[Path]) -> List[str]:
    """An image-folder run's class names (<run>/classes.json, written when it started)."""
    try:
        return json.loads(Run(run_dir).classes.read_text())
    except (OSError, ValueError, TypeError):
        raise UserError(f"no classes.json in run {run_dir}; export the run directory of an "
                        "imagefolder run (it records its class names there)") from None


def _must_exist(target: Path) -> None:
    if not target.exists():
        raise UserError(f"{target} not found; give a run directory (runs/<name>-<time>) or a checkpoint")


def _locate(target: Path):
    """(checkpoint directory, run directory or None) for a run, a checkpoints root or one
    checkpoint. A run's best/ comes first."""
    from .checkpoint import CheckpointError, latest, resolve_resume

    _must_exist(target)
    run = Run(target)
    if run.is_run():
        found = latest(run.best) or latest(run.checkpoints)
        if found is None:
            raise UserError(f"run {target} has no checkpoint yet (no best/ nor checkpoints/); "
                            "train it first, or give a checkpoint directory")
        return found, target
    try:
        found = resolve_resume(str(target), target)
    except CheckpointError:
        raise UserError(f"no checkpoint in {target}; give a run directory, or a checkpoint "
                        "(ckpt_*, or a checkpoints/ or best/ directory)") from None
    owner = Run.of_checkpoint(found)
    return found, owner.root if owner is not None else None


def main(argv: Optional[List[str]] = None) -> int:
    parser = ArgParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a run directory, or a checkpoint (ckpt_*, checkpoints/, best/)")
    parser.add_argument("--out", help="output directory (default: <run>/export); must not exist yet")
    parser.add_argument("-c", "--config", help="the config the checkpoint was trained with "
                                               "(default: the run's config.yaml)")
    args = parser.parse_args(argv)
    _must_exist(Path(args.target))       # the input's own mistakes, before paddle's import
    if args.out:
        check_out(Path(args.out))
    from .runtime.process import quiet_paddle

    with quiet_paddle():
        out = export_run(Path(args.target), Path(args.out) if args.out else None, args.config)
    deploy = json.loads((out / DEPLOY_FILE).read_text())
    print(f"paddle_dist: exported {deploy['checkpoint']} to {out}")
    print(f"  predict with: python -m paddle_dist.predict {out} IMAGE...")
    return 0


class _CallableModule(types.ModuleType):
    """`paddle_dist.export(net, input_spec, out)` calls export() while
    `python -m paddle_dist.export` runs main(): one name for both."""

    def __call__(self, net, input_spec: Sequence, out, info: Optional[Dict[str, Any]] = None) -> Path:
        return export(net, input_spec, out, info)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    run(main)
