"""CIFAR-10 with numpy only (no paddle): find it in any of its three on-disk forms, read it,
download it, augment and normalise batches, and write fake copies for tests.

- layout: forms, names, sizes, statistics, Paddle's cache, the one-line error;
- read: finding a copy and reading a split (a pickle may only name what a batch needs);
- download: the python archive, md5-checked, renamed into place when whole;
- augmentation: the seeded crop + flip, and normalisation;
- fake: fake copies in the real layouts, for tests and tools (`python -m paddle_dist.cifar fake`).

Like data/mnist.py this never imports paddle, so the launcher can check (and download) the data
once, before any rank starts. Every problem with a data file raises DataError with one
line: which file, what is wrong, and how to fix it.

Example:
    images, labels = load_cifar10("", "test")   # Paddle's cache: uint8 [10000, 3, 32, 32], int64 [10000]
    x = normalise(augment(images[:8], np.arange(8), seed=0, epoch=1))   # float32 [8, 3, 32, 32]
"""

from .augmentation import augment, normalise
from .download import download_cifar10
from .fake import fake_arrays, main, write_fake
from .layout import (ARCHIVE, BATCHES, BIN_DIR, FORMS, LABEL_NAMES, MD5, MEAN, NUM_CLASSES, PY_DIR, STD,
                     URL, default_root)
from .read import find_cifar10, load_cifar10

__all__ = ["ARCHIVE", "BATCHES", "BIN_DIR", "FORMS", "LABEL_NAMES", "MD5", "MEAN", "NUM_CLASSES", "PY_DIR",
           "STD", "URL", "augment", "default_root", "download_cifar10", "fake_arrays", "find_cifar10",
           "load_cifar10", "main", "normalise", "write_fake"]
