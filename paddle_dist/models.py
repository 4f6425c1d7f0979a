"""Model registry: `build(name)` returns a fresh `paddle.nn.Layer`.

Example:
    net = build("lenet")      # LeNet-style CNN for [N, 1, 28, 28] inputs
    net = build("resnet18")   # CIFAR-form ResNet-18 for [N, 3, 32, 32] inputs (or larger)
    net = build("resnet18", num_classes=5)
"""

from __future__ import annotations

from typing import Callable, Dict

import paddle
from paddle import nn

from .schema import MODEL_INPUTS, MODEL_TASKS
from .errors import ConfigError


class LinearNet(nn.Layer):
    """10 -> 10 -> 1 regression net, the classic `paddle.distributed.spawn` example."""

    def __init__(self, in_dim: int = 10, hidden: int = 10, out_dim: int = 1):
        super().__init__()
        self.linear1 = nn.Linear(in_dim, hidden)
        self.linear2 = nn.Linear(hidden, out_dim)

    def forward(self, x):
        return self.linear2(self.linear1(x))


class MLP(nn.Layer):
    """784 -> 512 -> 10 classifier on flattened 28x28 images."""

    def __init__(self, in_dim: int = 784, hidden: int = 512, num_classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        x = paddle.flatten(x, start_axis=1)
        return self.fc2(nn.functional.relu(self.fc1(x)))


class LeNet(nn.Layer):
    """LeNet-style CNN: two conv + max-pool blocks, three fully connected layers."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2D(1, 6, 3, stride=1, padding=1), nn.ReLU(), nn.MaxPool2D(2, 2),
            nn.Conv2D(6, 16, 5, stride=1, padding=0), nn.ReLU(), nn.MaxPool2D(2, 2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x):
        return self.classifier(paddle.flatten(self.features(x), start_axis=1))


def cifar_resnet(depth: int, num_classes: int = 10) -> nn.Layer:
    """paddle.vision's ResNet-18/50 in the CIFAR form: a 3x3 stride-1 stem and no max-pool,
    so a 32x32 image keeps its resolution into the first stage (the ImageNet stem would
    shrink it to 8x8 at once). Everything else is paddle.vision's own."""
    from paddle.vision.models import resnet18, resnet50

    net = {18: resnet18, 50: resnet50}[depth](num_classes=num_classes)
    net.conv1 = nn.Conv2D(3, 64, kernel_size=3, stride=1, padding=1, bias_attr=False)
    net.maxpool = nn.Identity()
    return net


# name -> constructor; schema.MODEL_TASKS says what each is for (its loss and metric),
# schema.MODEL_INPUTS the shape of one input sample.
# Classifiers take num_classes.
REGISTRY: Dict[str, Callable[..., nn.Layer]] = {
    "linear": LinearNet, "mlp": MLP, "lenet": LeNet,
    "resnet18": lambda num_classes=10: cifar_resnet(18, num_classes),
    "resnet50": lambda num_classes=10: cifar_resnet(50, num_classes),
}


def build(name: str, num_classes: int = 0) -> nn.Layer:
    """A fresh model; `num_classes` 0 keeps its default (10)."""
    if num_classes and MODEL_TASKS[_known(name)] == "classification":
        return REGISTRY[name](num_classes=num_classes)
    return REGISTRY[_known(name)]()


def task_of(name: str) -> str:
    return MODEL_TASKS[_known(name)]


def input_shape(name: str):
    """The shape of one input sample, e.g. (3, 32, 32) for the resnets."""
    return MODEL_INPUTS[_known(name)]


def _known(name: str) -> str:
    if name not in REGISTRY:
        raise ConfigError(f"model.name {name!r} is unknown; choose one of {', '.join(REGISTRY)}")
    return name
