"""paddle_dist: data-parallel PaddlePaddle training, on one card or many, with the plumbing done.

Example:
    import paddle_dist
    cfg = paddle_dist.load_config(overrides=["train.api=hapi"])
    paddle_dist.setup(cfg)
    result = paddle_dist.fit(my_net, train_ds, eval_ds, config=cfg)
"""

import warnings

# `import paddle` warns about a missing ccache on every import, in every rank.
warnings.filterwarnings("ignore", message="No ccache found")
# BatchNorm says, at every training forward, that it tracks the running statistics.
warnings.filterwarnings("ignore", message="When training, we now always track global mean")

# Before Paddle: its import runs with the garbage collector paused (a third of its CPU time).
from .runtime import paddle_import  # noqa: E402

paddle_import.install()

# Before Paddle: Paddle 2.6 with numpy 2 crashes when numpy.random comes after it (compat.py).
import numpy.random  # noqa: E402,F401

from .runtime import DistEnv, detect, launch_options  # noqa: E402  (first: env.py notes the user's variables before paddle)
from .config import Config, load as _load, with_overrides as _with_overrides  # noqa: E402
from .errors import for_scripts  # noqa: E402

# A script's own mistake (a config typo, bad data) is one line and exit 2, as it is on
# a launcher's command line, and still a ConfigError/DataError to catch (errors.for_scripts).
detect = for_scripts(detect)

__all__ = ["Config", "DistEnv", "checkpoint", "detect", "export", "fit", "load_config", "seed_everything",
           "setup", "steps"]
# These import paddle (about a second), which a launcher that only starts ranks never needs.
_LAZY = {"fit": "trainer", "steps": "trainer", "setup": "runtime.process", "seed_everything": "runtime.process"}


def __getattr__(name):
    import importlib

    if name in _LAZY:
        public = for_scripts(getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name))
        globals()[name] = public          # made once: found directly from now on
        return public
    if name in ("export", "checkpoint"):   # modules: paddle_dist.export(net, input_spec, out) is
        return importlib.import_module(f".{name}", __name__)   # callable; checkpoint.load_weights
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@for_scripts
def load_config(path=None, overrides=()) -> Config:
    """The config for a script of one's own: the typed defaults (constant lr, no scaling,
    no warm-up: nothing the script did not ask for), or the YAML file `path`, then
    `overrides`; then, under `python -m paddle_dist.launch`, its -c (in place of `path`)
    and -o (last: the command line wins). (train.py's default job, the demo, is
    configs/mnist_lenet.yaml: `load_config("mnist_lenet")`.)

    Example:
        cfg = paddle_dist.load_config(overrides=["train.api=hapi"])
    """
    given_path, given = launch_options()
    source = given_path or path
    if source is None:
        return _with_overrides([*overrides, *given])
    return _load(source, [*overrides, *given], fit_record=True)


__version__ = "0.1.0"
