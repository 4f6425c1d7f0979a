"""Your own images, one folder per class: `data.name: imagefolder`.

    <data.root>/train/<class>/*.png|jpg|...     training images
    <data.root>/val/<class>/*                   evaluation images, the same classes

(the convention of PaddleClas, torchvision and Keras). The classes are the sorted folder
names and the files are listed by paddle.vision's make_dataset, as DatasetFolder does
(which would drop an empty class folder silently); each image is decoded once with Pillow,
converted to RGB, resized so its shorter side is `data.image_size` and centre-cropped to a
square, and kept in memory as uint8. Batches are normalised with `data.mean` / `data.std`
(per channel, after scaling to [0, 1]); training batches are flipped left-right at random
when `data.augment` is on, as a function of (seed, epoch, sample) like CIFAR-10's.

Every problem is one line naming the folder or file: a missing split, an empty class
folder, an unreadable image, train and val with different classes.

Example:
    images, labels, classes = load_split("data/flowers", "train", size=64)
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from ..errors import DataError

SPLITS = ("train", "val")
EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def fit_image(image, size: int, color: str = "RGB") -> np.ndarray:
    """A PIL image as uint8 [C, size, size]: converted to `color`, its shorter side resized
    to `size` (bilinear) and the centre cropped. What training and predict both do.

    Example:
        fit_image(Image.open("cat.jpg"), 64).shape     # (3, 64, 64)
    """
    from PIL import Image

    image = image.convert(color)
    width, height = image.size
    scale = size / min(width, height)
    resized = (max(size, round(width * scale)), max(size, round(height * scale)))
    if resized != (width, height):
        image = image.resize(resized, Image.BILINEAR)
    left, top = (resized[0] - size) // 2, (resized[1] - size) // 2
    array = np.asarray(image.crop((left, top, left + size, top + size)), np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def load_split(root, split: str, size: int) -> Tuple[np.ndarray, np.ndarray, List[str]]:
    """(images uint8 [N, 3, size, size], labels int64 [N], class names) of one split.

    Raises DataError naming the folder or file for anything that cannot be used.
    """
    from PIL import Image, UnidentifiedImageError

    folder = Path(root) / split
    classes = _classes(folder, root, split)
    found = _samples(folder, classes)
    images = np.empty((len(found), 3, size, size), np.uint8)
    for i, (path, _) in enumerate(found):
        try:
            with Image.open(path) as image:
                images[i] = fit_image(image, size)
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise DataError(f"cannot read image {path} ({type(exc).__name__}); fix or remove it") from None
    return images, np.asarray([label for _, label in found], np.int64), classes


def load_imagefolder(root, size: int):
    """Both splits: ((train images, labels), (val images, labels), class names), checking
    that they have the same classes."""
    if not str(root):
        raise DataError("data.name=imagefolder needs data.root: a folder with train/<class>/ "
                        "and val/<class>/ image folders")
    train = load_split(root, "train", size)
    val = load_split(root, "val", size)
    if train[2] != val[2]:
        only_train = sorted(set(train[2]) - set(val[2]))
        only_val = sorted(set(val[2]) - set(train[2]))
        raise DataError(f"{root}: train/ and val/ have different classes (only in train: "
                        f"{', '.join(only_train) or '-'}; only in val: {', '.join(only_val) or '-'}); "
                        "give both the same class folders")
    return train[:2], val[:2], train[2]


def flip(images: np.ndarray, keys: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """Each image flipped left-right with probability 1/2, as a function of (seed, epoch,
    key) only (see cifar.augmentation._sample_bits): the same in any batch, on any rank, after a resume."""
    from ..cifar.augmentation import _sample_bits

    flipped = (_sample_bits(np.asarray(keys, np.int64), seed, epoch) >> np.uint64(63)).astype(bool)
    out = np.array(images)
    out[flipped] = out[flipped][..., ::-1]
    return out


def parse_floats(text: str, key: str, count: int = 3) -> Tuple[float, ...]:
    """"0.5,0.5,0.5" -> (0.5, 0.5, 0.5); one value is used for every channel."""
    try:
        values = tuple(float(part) for part in str(text).split(","))
    except ValueError:
        values = ()
    if len(values) == 1:
        values *= count
    if len(values) != count:
        raise DataError(f"{key}={text!r} must be {count} numbers (or one), e.g. 0.485,0.456,0.406")
    return values


def _classes(folder: Path, root, split: str) -> List[str]:
    """The class folders' names, sorted: DatasetFolder's classes and label order."""
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder; data.root={root} must hold {split}/<class>/ "
                        "folders of images")
    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    if not classes:
        raise DataError(f"{folder} has no class folders; put each class's images in {folder}/<class>/")
    return classes


def _samples(folder: Path, classes: Sequence[str]) -> List[Tuple[str, int]]:
    """(path, label) of every image, in class then path order (DatasetFolder's); an empty
    class folder is an error (DatasetFolder would drop it silently)."""
    from paddle.vision.datasets.folder import make_dataset

    index = {name: i for i, name in enumerate(classes)}
    found = make_dataset(str(folder), index, EXTENSIONS)
    counts = np.bincount([label for _, label in found], minlength=len(classes))
    for name, count in zip(classes, counts):
        if count == 0:
            raise DataError(f"class folder {folder / name} holds no images ({', '.join(EXTENSIONS[:3])}, ...); "
                            "add some or remove the folder")
    return found
