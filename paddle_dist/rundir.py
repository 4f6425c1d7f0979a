"""The run directory's name and creation (no paddle needed: launchers create it too).

Example:
    run_dir = create(cfg)    # runs/mnist_lenet-20260101-120000, or output.run_dir
"""

from __future__ import annotations

import time
from pathlib import Path

from .errors import UserError


def create(cfg) -> Path:
    """Create and return the run directory `cfg.output` names (see runtime.make_run_dir)."""
    named = cfg.output.run_dir
    if not named and cfg.dist.nnodes > 1:
        # Every machine must agree on the name without talking: derive it from the master.
        named = Path(cfg.output.root) / f"{cfg.output.name}-{cfg.dist.master.replace(':', '-')}"
    if named:
        path = Path(named)
        if path.exists() and not path.is_dir():
            raise UserError(f"output.run_dir {path} is a file; give a directory")
        if (path / "metrics.json").exists():
            raise UserError(f"output.run_dir {path} already holds a finished run; "
                            "choose another output.run_dir or remove that one")
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.output.root) / f"{cfg.output.name}-{stamp}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")
