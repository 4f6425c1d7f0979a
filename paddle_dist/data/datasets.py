"""Datasets: MNIST (bundled 4,000/1,000 subset or a full copy; files read by mnist.py),
CIFAR-10 (any of its on-disk forms, read by the cifar package) and synthetic data, in memory, with
one-op batch gathering.

Example:
    train = mnist_dataset("", "train")          # bundled subset, x [4000, 1, 28, 28]
    x, y = train.batch([0, 1, 2])               # y is int64 [3, 1]
    cifar = cifar10_dataset("data/cifar-10-python.tar.gz", "train", augment=True, seed=2024)
"""

import math

import numpy as np
import paddle

from .. import cifar
from . import imagefolder
from .mnist import (BUNDLED_MNIST, MNIST_FILES, MNIST_MEAN, MNIST_STD, NUM_CLASSES, find_mnist_file,  # noqa: F401
                    load_mnist, read_idx)

__all__ = ["ArrayDataset", "CifarDataset", "cifar10_dataset", "imagefolder_datasets", "BUNDLED_MNIST", "MNIST_FILES", "NUM_CLASSES", "find_mnist_file",
           "linear_regression", "load_mnist", "mnist_dataset", "read_idx", "synthetic_classification"]

# The teacher behind the synthetic sets does not depend on `seed`, so seed=0 and seed=1
# give a train and a test set of the same task.
_TEACHER_SEED = 20240601


class ArrayDataset(paddle.io.Dataset):
    """In-memory samples: `x` float32 [N, ...] and `y` [N, ...].

    Classification labels are int64 [N, 1] (what CrossEntropyLoss and hapi's Accuracy
    take); regression targets are float32 [N, out_dim].

    Example:
        ds = ArrayDataset(np.zeros((4, 3)), np.zeros((4, 1), np.int64))
        x0, y0 = ds[0]; xb, yb = ds.batch([0, 2])
    """

    def __init__(self, x, y):
        super().__init__()
        x, y = np.asarray(x, dtype=np.float32), np.asarray(y)
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        self.x, self.y = x, y

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)

    def batch(self, indices):
        """Return (x[indices], y[indices]) with one fancy-indexing op per array."""
        idx = np.asarray(indices, dtype=np.int64)
        return self.x[idx], self.y[idx]


class CifarDataset(paddle.io.Dataset):
    """Images kept as uint8 [N, 3, H, W] (CIFAR-10's, or an image folder's); each batch is
    gathered, augmented (training; CIFAR-10: random crop with 4-pixel padding and a
    horizontal flip) and normalised (mean, std) in a few vectorised numpy ops.

    The augmentation of a sample is a function of (seed, epoch, sample index) only
    (cifar.augment): the same on a re-run or a resume, whatever the world size, and
    different in every epoch. The sampler calls `set_epoch` at the start of each epoch.

    Example:
        ds = CifarDataset(images, labels, augment=True, seed=2024)
        ds.set_epoch(3); x, y = ds.batch([0, 5])   # x float32 [2, 3, 32, 32], y int64 [2, 1]
    """

    def __init__(self, images, labels, augment: bool = False, seed: int = 0,
                 mean=cifar.MEAN, std=cifar.STD, transform=cifar.augment):
        super().__init__()
        self.images, self.labels = images, np.asarray(labels, dtype=np.int64).reshape(-1, 1)
        self.augment, self.seed, self.epoch = augment, seed, 0
        self.mean, self.std, self.transform = mean, std, transform

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, i):
        x, y = self.batch([i])
        return x[0], y[0]

    def __len__(self):
        return len(self.images)

    def batch(self, indices):
        idx = np.asarray(indices, dtype=np.int64)
        images = self.images[idx]
        if self.augment:
            images = self.transform(images, idx, self.seed, self.epoch)
        return cifar.normalise(images, self.mean, self.std), self.labels[idx]


def imagefolder_datasets(d, seed: int):
    """(train, val, class names) of `data.name: imagefolder` (see imagefolder.py) from the
    config's data section `d`: the same in-memory batches as CIFAR-10's, with its size,
    mean, std and a flip seeded by `seed`."""
    mean, std = imagefolder.parse_floats(d.mean, "data.mean"), imagefolder.parse_floats(d.std, "data.std")
    (train_x, train_y), (val_x, val_y), classes = imagefolder.load_imagefolder(d.root, d.image_size)
    train = CifarDataset(train_x, train_y, augment=d.augment, seed=seed, mean=mean, std=std,
                         transform=imagefolder.flip)
    return train, CifarDataset(val_x, val_y, mean=mean, std=std), classes


def cifar10_dataset(root, split, augment=False, seed=0):
    """CIFAR-10 `split` ("train" | "test") from `root` (see cifar.load_cifar10).

    Example:
        ds = cifar10_dataset("", "test")     # Paddle's cache; 10,000 images, no augmentation
    """
    images, labels = cifar.load_cifar10(root, split)
    return CifarDataset(images, labels, augment=augment, seed=seed)


def mnist_dataset(root, split, flatten=False):
    """MNIST normalised with mean 0.1307 / std 0.3081: x float32 [N, 1, 28, 28] or [N, 784].

    Example:
        ds = mnist_dataset("", "train", flatten=True)   # x [4000, 784], y int64 [4000, 1]
    """
    images, labels = load_mnist(root, split)
    x = (images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD
    x = x.reshape(len(x), -1) if flatten else x[:, None]
    return ArrayDataset(x, labels.reshape(-1, 1))


def synthetic_classification(num_samples, shape=(1, 28, 28), num_classes=10, seed=0):
    """Gaussian inputs labelled by a fixed random linear teacher (argmax), so it is learnable.

    The same `seed` gives the same samples; the teacher depends only on shape and
    num_classes, so different seeds give a train and a test set of one task.

    Example:
        ds = synthetic_classification(256, shape=(20,), num_classes=4)   # y int64 [256, 1]
    """
    features = math.prod(shape)
    teacher = np.random.RandomState(_TEACHER_SEED).standard_normal((features, num_classes))
    x = np.random.RandomState(seed).standard_normal((num_samples, *shape)).astype(np.float32)
    labels = np.argmax(x.reshape(num_samples, features) @ teacher, axis=1)
    return ArrayDataset(x, labels.astype(np.int64).reshape(-1, 1))


def linear_regression(num_samples, in_dim=10, out_dim=1, seed=0, noise=0.01):
    """x ~ N(0, 1) [N, in_dim], y = x @ W + b + noise [N, out_dim], all float32.

    W and b depend only on the dims (like the classification teacher); `seed` picks samples.

    Example:
        ds = linear_regression(128, in_dim=3, out_dim=2, seed=1)
    """
    teacher = np.random.RandomState(_TEACHER_SEED)
    weights, bias = teacher.standard_normal((in_dim, out_dim)), teacher.standard_normal(out_dim)
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((num_samples, in_dim))
    y = x @ weights + bias + noise * rng.standard_normal((num_samples, out_dim))
    return ArrayDataset(x.astype(np.float32), y.astype(np.float32))
