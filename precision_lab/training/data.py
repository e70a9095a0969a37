"""The dataset of the training run: scikit-learn's handwritten digits (shipped inside sklearn).

1797 images of 8x8 pixels (values 0..16), 10 classes. :func:`load_digits_split` returns a seeded,
stratified train/test split with the pixels standardised by the training set's mean and spread,
as float32.

>>> d = load_digits_split(seed=0)
>>> d.x_train.shape, d.x_test.shape, d.x_train.dtype, d.n_classes
((1347, 64), (450, 64), dtype('float32'), 10)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Dataset", "load_digits_split"]


@dataclass(frozen=True)
class Dataset:
    """A train/test split: features float32 (n, d), labels int64 (n,)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    name: str = "digits"


def load_digits_split(*, seed: int = 0, test_fraction: float = 0.25) -> Dataset:
    """scikit-learn's digits, split (stratified by class, seeded) and standardised.

    Needs scikit-learn (``pip install scikit-learn``); the data ships inside the package, so
    nothing is downloaded.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the training run needs scikit-learn for its dataset: pip install scikit-learn"
        ) from e
    d = load_digits()
    x = np.asarray(d.data, dtype=np.float64)
    y = np.asarray(d.target, dtype=np.int64)
    rng = np.random.default_rng(seed)
    test_idx = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        test_idx.append(idx[: round(len(idx) * test_fraction)])
    test = np.zeros(len(y), dtype=bool)
    test[np.concatenate(test_idx)] = True
    mean = x[~test].mean(axis=0)
    std = x[~test].std(axis=0)
    std[std == 0] = 1.0
    z = ((x - mean) / std).astype(np.float32)
    return Dataset(
        x_train=z[~test],
        y_train=y[~test],
        x_test=z[test],
        y_test=y[test],
        n_classes=int(y.max()) + 1,
    )
