"""The built-in job's data sets (`data.name`), one entry each: how it is built, which
models it fits, and how an image becomes its model's input for export. Everything that
knows a data set asks here: the launcher's and the rank's checks, the worker that builds
the data, export's deploy.json and the run's last line. The standard library only at
import: the launcher checks a config without paddle.

An entry:
- `name`, `task` (classification | regression) and `shape` (one sample's, or None when
  the model decides it: synthetic data, linear regression), `any_size`: images of
  data.image_size that only models of any input size take (an image folder), and
  `classes_in_run`: its class names are found when it is read, and kept in the run's
  classes.json (an image folder's);
- `build(cfg)` -> (train, eval, class names or None), imported when used;
- `preprocess(cfg)` -> deploy.json's "preprocess" and the class names: what the training
  pipeline does to an image, written down (None for data that are no images);
- `verify(cfg)`: reads the data once in the launcher, with numpy at most, so that bad or
  missing data fails before any rank starts (None: nothing to read, e.g. generated data).

Adding a data set is an entry here (`register`) and its reader in data/
(tests/integration/test_extensions.py adds a toy one from a script).

Example:
    check(cfg)                      # ConfigError when data.name and model.name do not fit
    verify(cfg)                     # DataError when its files are missing or broken
    train, test, classes = get(cfg.data.name).build(cfg)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import ConfigError
from ..schema import ANY_SIZE_MODELS, MODEL_INPUTS, MODEL_TASKS
from ..schema import Config

Built = Tuple[Any, Any, Optional[List[str]]]


@dataclass(frozen=True)
class DataSet:
    name: str
    task: str                                     # classification | regression
    shape: Optional[Tuple[int, ...]]              # one sample's; None: the model's
    build: Callable[[Any], Built]
    preprocess: Optional[Callable[[Any], Tuple[Dict[str, Any], Optional[List[str]]]]] = None
    any_size: bool = False                        # images of data.image_size
    classes_in_run: bool = False                  # its class names: the run's classes.json
    verify: Optional[Callable[[Any], None]] = None   # the launcher's read (no paddle)

    @property
    def images(self) -> bool:
        """Whether paddle_dist.export can feed it (it has a preprocessing)."""
        return self.preprocess is not None


REGISTRY: Dict[str, DataSet] = {}


def register(data_set: DataSet) -> DataSet:
    REGISTRY[data_set.name] = data_set
    return data_set


def get(name: str) -> DataSet:
    if name not in REGISTRY:
        raise ConfigError(f"data.name must be one of {', '.join(REGISTRY)} (got {name!r})")
    return REGISTRY[name]


def check(cfg: Config) -> None:
    """data.name has an entry and model.name fits it: the same task, and the data's
    images the model's input (ConfigError, one line, naming the models that fit)."""
    data, model = get(cfg.data.name), cfg.model.name
    task = MODEL_TASKS[model]
    if task != data.task:
        raise ConfigError(f"model.name={model} ({task}) does not fit data.name={data.name} ({data.task}); "
                          "use model.name=linear with data.name=linear, a classifier (lenet, mlp, "
                          "resnet18, resnet50) with mnist, cifar10 or synthetic")
    if data.shape and data.shape != MODEL_INPUTS[model]:
        fits = [m for m, s in MODEL_INPUTS.items() if s == data.shape]
        raise ConfigError(f"model.name={model} takes {_dims(MODEL_INPUTS[model])} inputs but "
                          f"data.name={data.name} has {_dims(data.shape)} images; use model.name={' or '.join(fits)}")
    if data.any_size and model not in ANY_SIZE_MODELS:
        size = cfg.data.image_size
        raise ConfigError(f"model.name={model} takes {_dims(MODEL_INPUTS[model])} inputs but "
                          f"data.name={data.name} has 3x{size}x{size} images; use model.name="
                          f"{' or '.join(ANY_SIZE_MODELS)}")


def _dims(shape) -> str:
    return "x".join(str(n) for n in shape)


def verify(cfg: Config) -> None:
    """Read the config's data once, through its entry's `verify`, so that bad or missing data
    fails here, before any rank starts (the launcher calls it; CIFAR-10 is downloaded here,
    once, when data.root is "" and Paddle's cache has none).

    Example:
        verify(load_config(None, ["data.name=mnist", "data.root=/nowhere"]))   # DataError
    """
    data = get(cfg.data.name)
    if data.verify is not None:
        data.verify(cfg)


def preprocessing(cfg: Config, classes: Optional[List[str]] = None) -> Dict[str, Any]:
    """How an image becomes the model's input for this config's data (deploy.json's
    "input_shape", "classes", "preprocess"); `classes`: an image folder's names."""
    data = get(cfg.data.name)
    if not data.images:       # class numbers: the model's outputs (synthetic data: 10)
        count = cfg.model.num_classes or 10
        classes = [str(c) for c in range(count)] if data.task == "classification" else None
        return {"input_shape": list(MODEL_INPUTS[cfg.model.name]), "classes": classes, "preprocess": None}
    pre, own = data.preprocess(cfg)
    channels = 1 if pre["color"] == "L" else 3
    pre.update(layout="NCHW", scale=1 / 255,
               resize="shorter side to height (bilinear), then the centre crop of height x width")
    return {"input_shape": [channels, pre["height"], pre["width"]], "classes": classes or own,
            "preprocess": pre}


# ---------------------------------------------------------------- the built-in data sets
def _mnist(cfg: Config) -> Built:
    from .datasets import mnist_dataset

    flatten = cfg.model.name == "mlp"
    return (mnist_dataset(cfg.data.root, "train", flatten=flatten),
            mnist_dataset(cfg.data.root, "test", flatten=flatten), None)


def _mnist_pre(cfg: Config):
    from .mnist import MNIST_MEAN, MNIST_STD

    return ({"color": "L", "height": 28, "width": 28, "mean": [MNIST_MEAN], "std": [MNIST_STD]},
            [str(d) for d in range(10)])


def _mnist_verify(cfg: Config) -> None:
    from .mnist import load_mnist

    for split in ("train", "test"):
        load_mnist(cfg.data.root, split)


def _cifar10(cfg: Config) -> Built:
    from .datasets import cifar10_dataset

    d = cfg.data
    return (cifar10_dataset(d.root, "train", augment=d.augment, seed=cfg.train.seed),
            cifar10_dataset(d.root, "test"), None)


def _cifar10_pre(cfg: Config):
    from .. import cifar

    return ({"color": "RGB", "height": 32, "width": 32, "mean": list(cifar.MEAN), "std": list(cifar.STD)},
            list(cifar.LABEL_NAMES))


def _cifar10_verify(cfg: Config) -> None:
    from ..cifar import load_cifar10

    for split in ("train", "test"):
        load_cifar10(cfg.data.root, split)


def _imagefolder(cfg: Config) -> Built:
    from .datasets import imagefolder_datasets

    return imagefolder_datasets(cfg.data, cfg.train.seed)


def _imagefolder_pre(cfg: Config):
    from .imagefolder import parse_floats

    size = cfg.data.image_size
    return ({"color": "RGB", "height": size, "width": size, "mean": list(parse_floats(cfg.data.mean, "data.mean")),
             "std": list(parse_floats(cfg.data.std, "data.std"))}, None)


def _imagefolder_verify(cfg: Config) -> None:
    from .imagefolder import load_imagefolder, parse_floats

    parse_floats(cfg.data.mean, "data.mean")
    parse_floats(cfg.data.std, "data.std")
    load_imagefolder(cfg.data.root, cfg.data.image_size)


def _synthetic(cfg: Config) -> Built:
    from .datasets import synthetic_classification

    d, shape = cfg.data, MODEL_INPUTS[cfg.model.name]
    return (synthetic_classification(d.num_samples, shape, seed=d.seed),
            synthetic_classification(d.num_eval_samples, shape, seed=d.seed + 1), None)


def _linear(cfg: Config) -> Built:
    from .datasets import linear_regression

    d = cfg.data
    return linear_regression(d.num_samples, seed=d.seed), linear_regression(d.num_eval_samples, seed=d.seed + 1), None


register(DataSet("mnist", "classification", (1, 28, 28), _mnist, _mnist_pre, verify=_mnist_verify))
register(DataSet("cifar10", "classification", (3, 32, 32), _cifar10, _cifar10_pre, verify=_cifar10_verify))
register(DataSet("imagefolder", "classification", None, _imagefolder, _imagefolder_pre, any_size=True,
                 classes_in_run=True, verify=_imagefolder_verify))
register(DataSet("synthetic", "classification", None, _synthetic))
register(DataSet("linear", "regression", None, _linear))
