"""data.name=imagefolder: real PNG and JPEG files in class folders (paddle_dist/data/imagefolder.py),
and the config checks that go with it."""

import numpy as np
import pytest
from PIL import Image

from paddle_dist import config as configlib
from paddle_dist.data import imagefolder, registry
from paddle_dist.errors import ConfigError, DataError


def make_tree(root, classes=("cat", "dog"), per_class=3, splits=("train", "val")):
    for split in splits:
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = np.full((10, 14, 3), 40 * c + i, np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def test_classes_come_from_the_folders_and_images_are_squared(tmp_path):
    (train_x, train_y), (val_x, val_y), classes = imagefolder.load_imagefolder(make_tree(tmp_path), 8)
    assert classes == ["cat", "dog"]
    assert train_x.shape == (6, 3, 8, 8) and train_x.dtype == np.uint8
    assert train_y.tolist() == [0, 0, 0, 1, 1, 1] and val_y.tolist() == train_y.tolist()
    assert train_x[4, 0, 0, 0] == 41                    # dog, image 1: a flat 41, kept flat


def test_fit_image_resizes_the_shorter_side_and_takes_the_centre():
    pixels = np.zeros((4, 8), np.uint8)
    pixels[:, 2:6] = 255                                # the centre 4 columns are white
    out = imagefolder.fit_image(Image.fromarray(pixels), 4, "L")
    assert out.shape == (1, 4, 4) and (out == 255).all()
    assert imagefolder.fit_image(Image.fromarray(pixels), 4).shape == (3, 4, 4)


@pytest.mark.parametrize("damage, words", [
    (lambda root: (root / "train" / "bird").mkdir(), "class folder {root}/train/bird holds no images"),
    (lambda root: (root / "val" / "dog" / "1.png").write_bytes(b"not a png"),
     "cannot read image {root}/val/dog/1.png"),
    (lambda root: (root / "val" / "dog").rename(root / "val" / "wolf"),
     "train/ and val/ have different classes (only in train: dog; only in val: wolf)"),
    (lambda root: __import__("shutil").rmtree(root / "val"), "{root}/val is not a folder"),
])
def test_an_unusable_folder_is_named(tmp_path, damage, words):
    root = make_tree(tmp_path)
    damage(root)
    with pytest.raises(DataError) as err:
        imagefolder.load_imagefolder(root, 8)
    assert words.format(root=root) in str(err.value) and "\n" not in str(err.value)


def test_flip_is_a_function_of_seed_epoch_and_sample():
    images = np.arange(2 * 3 * 2 * 2, dtype=np.uint8).reshape(2, 3, 2, 2)
    keys = np.array([5, 9])
    once = imagefolder.flip(images, keys, seed=1, epoch=2)
    assert (imagefolder.flip(images[::-1], keys[::-1], 1, 2) == once[::-1]).all()   # any batch order
    for out, image in zip(once, images):
        assert (out == image).all() or (out == image[..., ::-1]).all()


def test_mean_and_std_take_one_or_three_numbers():
    assert imagefolder.parse_floats("0.5", "data.mean") == (0.5, 0.5, 0.5)
    assert imagefolder.parse_floats("0.1,0.2,0.3", "data.std") == (0.1, 0.2, 0.3)
    with pytest.raises(DataError, match="data.mean='a,b' must be 3 numbers"):
        imagefolder.parse_floats("a,b", "data.mean")


def test_an_image_folder_needs_a_model_for_any_image_size():
    with pytest.raises(ConfigError, match="use model.name=resnet18 or resnet50"):
        registry.check(configlib.load(overrides=["data.name=imagefolder", "model.name=lenet"]))
    registry.check(configlib.load(overrides=["data.name=imagefolder", "model.name=resnet18"]))


def test_evaluating_only_needs_a_checkpoint():
    for item in ("train.eval_only=true", "train.epochs=0"):
        with pytest.raises(ConfigError, match="needs the checkpoint to evaluate"):
            configlib.load(overrides=[item])
        assert configlib.evaluates_only(configlib.load(overrides=[item, "checkpoint.resume=runs/x"]))
