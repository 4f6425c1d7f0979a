"""Unit tests for paddle_dist.data.datasets (fast, single process)."""

import numpy as np
import pytest

from paddle_dist.data.datasets import (ArrayDataset, linear_regression, load_mnist, mnist_dataset,
                                       synthetic_classification)


# --- datasets ----------------------------------------------------------------------------

def test_mnist_dataset_shapes_and_normalisation():
    images, labels = load_mnist("", "test")
    ds = mnist_dataset("", "test")
    assert ds.x.shape == (1000, 1, 28, 28) and ds.x.dtype == np.float32
    assert ds.y.shape == (1000, 1) and ds.y.dtype == np.int64
    assert len(ds) == 1000
    expected = (images[5].astype(np.float32) / 255 - 0.1307) / 0.3081
    np.testing.assert_allclose(ds[5][0][0], expected, rtol=1e-6)
    assert ds[5][1].tolist() == [labels[5]]
    assert ds.x.min() == pytest.approx(-0.1307 / 0.3081, rel=1e-5)
    assert abs(float(ds.x.mean())) < 0.1 and abs(float(ds.x.std()) - 1) < 0.1


def test_mnist_dataset_flatten():
    flat = mnist_dataset("", "test", flatten=True)
    full = mnist_dataset("", "test")
    assert flat.x.shape == (1000, 784) and flat.x.dtype == np.float32
    assert np.array_equal(flat.x, full.x.reshape(1000, 784))
    assert np.array_equal(flat.y, full.y)


def test_synthetic_classification_deterministic_and_learnable():
    a = synthetic_classification(300, shape=(3, 4), num_classes=5, seed=3)
    b = synthetic_classification(300, shape=(3, 4), num_classes=5, seed=3)
    c = synthetic_classification(300, shape=(3, 4), num_classes=5, seed=4)
    assert a.x.shape == (300, 3, 4) and a.x.dtype == np.float32
    assert a.y.shape == (300, 1) and a.y.dtype == np.int64
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)
    assert set(a.y.ravel().tolist()) == set(range(5))
    # A least-squares fit on one seed predicts labels of another: same teacher, learnable task.
    onehot = np.eye(5)[a.y.ravel()]
    w, *_ = np.linalg.lstsq(a.x.reshape(300, -1), onehot, rcond=None)
    accuracy = np.mean(np.argmax(c.x.reshape(300, -1) @ w, axis=1) == c.y.ravel())
    assert accuracy > 0.6


def test_synthetic_classification_default_shape():
    ds = synthetic_classification(8)
    assert ds.x.shape == (8, 1, 28, 28) and ds.y.max() < 10


def test_linear_regression_deterministic_and_fits():
    a = linear_regression(200, in_dim=4, out_dim=2, seed=1)
    b = linear_regression(200, in_dim=4, out_dim=2, seed=1)
    c = linear_regression(200, in_dim=4, out_dim=2, seed=2)
    assert a.x.shape == (200, 4) and a.y.shape == (200, 2)
    assert a.x.dtype == np.float32 and a.y.dtype == np.float32
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)
    # y is affine in x up to noise 0.01: a least-squares fit leaves tiny residuals.
    design = np.column_stack([a.x, np.ones(200)])
    coef, *_ = np.linalg.lstsq(design, a.y, rcond=None)
    assert np.abs(design @ coef - a.y).max() < 0.05


def test_linear_regression_defaults():
    ds = linear_regression(16)
    assert ds.x.shape == (16, 10) and ds.y.shape == (16, 1)


def test_array_dataset_batch_matches_getitem():
    ds = synthetic_classification(20, shape=(2, 3), num_classes=3, seed=0)
    indices = [4, 0, 19, 4]
    xb, yb = ds.batch(indices)
    assert np.array_equal(xb, np.stack([ds[i][0] for i in indices]))
    assert np.array_equal(yb, np.stack([ds[i][1] for i in indices]))
    assert xb.dtype == np.float32 and yb.dtype == np.int64 and yb.shape == (4, 1)


def test_array_dataset_rejects_length_mismatch():
    with pytest.raises(ValueError):
        ArrayDataset(np.zeros((3, 2)), np.zeros((2, 1)))
