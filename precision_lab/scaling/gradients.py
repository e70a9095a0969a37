"""Seeded sources of gradient values spanning many decades, and storage of recorded gradients.

Gradient magnitudes in deep networks are close to log-normal: ``log2|g|`` is roughly normal with a
centre far below 1 (Micikevicius et al. 2018 show activation gradients of an SSD detector
centred near 2**-25 with a spread of ten binades). These generators draw such values reproducibly:

* :func:`lognormal`: ``|g| = 2**N(mu, sigma)`` with random signs;
* :func:`mixture`: several log-normal components (e.g. a bulk and a tail of tiny values);
* :class:`DriftingGradients`: per-layer gradients over training steps, each layer centred lower
  than the one after it, the centre drifting down as training converges, with occasional spikes;
  step ``t`` of layer ``l`` is drawn from its own seeded stream, so any step can be regenerated
  alone;
* :func:`save_gradients` / :func:`load_gradients`: named arrays (e.g. recorded from the training run
  in :mod:`precision_lab.training`) as a compressed ``.npz`` file.

Values are drawn in float64 and returned in ``dtype`` (float32 by default, the dtype of master
gradients). The same seed gives the same values on every machine (numpy's PCG64).

>>> g = lognormal(5, mu=-20.0, sigma=2.0, seed=1)
>>> g.dtype, bool(np.all(np.abs(g) < 2.0**-10))
(dtype('float32'), True)
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DriftingGradients",
    "load_gradients",
    "lognormal",
    "mixture",
    "save_gradients",
]


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    return int(n)


def _check_sigma(sigma: Any, name: str = "sigma") -> float:
    s = float(sigma)
    if not (math.isfinite(s) and s >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {sigma!r}")
    return s


def _check_mu(mu: Any, name: str = "mu") -> float:
    m = float(mu)
    if not math.isfinite(m):
        raise ValueError(f"{name} must be finite, got {mu!r}")
    return m


def _out_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    return dt


def _signs(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.where(rng.integers(0, 2, n, dtype=np.uint8) == 1, -1.0, 1.0)


def lognormal(
    n: int,
    *,
    mu: float = -20.0,
    sigma: float = 3.0,
    seed: int = 0,
    signed: bool = True,
    dtype: Any = np.float32,
) -> np.ndarray:
    """``n`` values with ``log2|g| ~ Normal(mu, sigma)`` (random signs if ``signed``).

    The fraction of such values below a threshold ``t`` is ``Phi((log2(t) - mu) / sigma)``; see
    :func:`precision_lab.analysis.analytic_zero_fraction`.

    >>> g = lognormal(100_000, mu=-10.0, sigma=1.0, seed=0, dtype=np.float64)
    >>> round(float(np.mean(np.log2(np.abs(g)))), 2), round(float(np.std(np.log2(np.abs(g)))), 2)
    (-10.0, 1.0)
    """
    n = _check_n(n)
    mu, sigma = _check_mu(mu), _check_sigma(sigma)
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n) * sigma + mu
    g = np.exp2(e)
    if signed:
        g *= _signs(rng, n)
    return g.astype(_out_dtype(dtype))


def mixture(
    n: int,
    components: Sequence[tuple[float, float, float]],
    *,
    seed: int = 0,
    signed: bool = True,
    dtype: Any = np.float32,
) -> np.ndarray:
    """``n`` values from a mixture of log-normals, ``components = [(weight, mu, sigma), ...]``
    (weights are normalised; each value picks its component at random).

    >>> g = mixture(10_000, [(0.9, -12.0, 1.0), (0.1, -30.0, 1.0)], seed=3)
    >>> float(np.mean(np.abs(g) < 2.0**-21))
    0.1004
    """
    n = _check_n(n)
    if not components:
        raise ValueError("components must hold at least one (weight, mu, sigma) tuple")
    w = np.array([float(c[0]) for c in components])
    if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
        raise ValueError(f"component weights must be >= 0 with a positive sum, got {w.tolist()}")
    mus = np.array([_check_mu(c[1]) for c in components])
    sigmas = np.array([_check_sigma(c[2]) for c in components])
    rng = np.random.default_rng(seed)
    which = rng.choice(len(components), size=n, p=w / w.sum())
    g = np.exp2(rng.standard_normal(n) * sigmas[which] + mus[which])
    if signed:
        g *= _signs(rng, n)
    return g.astype(_out_dtype(dtype))


@dataclass(frozen=True)
class DriftingGradients:
    """Per-layer gradient values over training steps.

    Layer ``l`` (0 = input side) at step ``t`` is log-normal with centre
    ``mu + (n_layers - 1 - l) * layer_offset + t * drift`` (in log2) and spread ``sigma``: the
    layers far from the loss get smaller gradients (``layer_offset < 0``) and gradients shrink as
    the loss falls (``drift < 0``). With probability ``spike_prob`` a step is a spike: every layer's
    values are multiplied by ``2**spike_log2`` (a bad batch, a loss spike) -- what makes a dynamic
    loss scaler back off.

    ``step(t)`` returns the list of per-layer arrays of step ``t``; it depends only on
    ``(seed, t)``, so steps can be drawn in any order.

    >>> src = DriftingGradients(n_layers=3, n_per_layer=1000, seed=5)
    >>> [round(float(np.median(np.log2(np.abs(g))))) for g in src.step(0)]
    [-26, -24, -22]
    >>> bool(np.array_equal(src.step(7)[1], src.step(7)[1]))
    True
    """

    n_layers: int = 4
    n_per_layer: int = 10_000
    mu: float = -22.0
    sigma: float = 3.0
    layer_offset: float = -2.0
    drift: float = -0.002
    spike_prob: float = 0.01
    spike_log2: float = 12.0
    seed: int = 0
    dtype: Any = np.float32

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_per_layer"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        _check_mu(self.mu)
        _check_sigma(self.sigma)
        _check_mu(self.layer_offset, "layer_offset")
        _check_mu(self.drift, "drift")
        _check_mu(self.spike_log2, "spike_log2")
        if not 0.0 <= float(self.spike_prob) <= 1.0:
            raise ValueError(f"spike_prob must be in [0, 1], got {self.spike_prob!r}")
        _out_dtype(self.dtype)

    def centre(self, t: int, layer: int) -> float:
        """log2 centre of layer ``layer`` at step ``t`` (spikes not included)."""
        return self.mu + (self.n_layers - 1 - layer) * self.layer_offset + t * self.drift

    def is_spike(self, t: int) -> bool:
        """Whether step ``t`` is a spike."""
        rng = np.random.default_rng([self.seed, t, 1 << 20])
        return bool(rng.random() < self.spike_prob)

    def step(self, t: int) -> list[np.ndarray]:
        """The per-layer gradient arrays of step ``t``."""
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or t < 0:
            raise ValueError(f"t must be a non-negative integer, got {t!r}")
        shift = self.spike_log2 if self.is_spike(int(t)) else 0.0
        out = []
        for layer in range(self.n_layers):
            rng = np.random.default_rng([self.seed, int(t), layer])
            e = rng.standard_normal(self.n_per_layer) * self.sigma
            e += self.centre(int(t), layer) + shift
            g = np.exp2(e) * _signs(rng, self.n_per_layer)
            out.append(g.astype(_out_dtype(self.dtype)))
        return out

    def steps(self, n_steps: int, start: int = 0) -> Iterator[list[np.ndarray]]:
        """Iterate over steps ``start, start + 1, ...`` (``n_steps`` of them)."""
        for t in range(start, start + _check_n(n_steps)):
            yield self.step(t)


def save_gradients(path: str | Path, grads: dict[str, Any]) -> Path:
    """Save named gradient arrays to a compressed ``.npz`` file; returns the path.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> p = save_gradients(os.path.join(d, "g.npz"), {"layer0": np.ones(3, np.float32)})
    >>> load_gradients(p)["layer0"].tolist()
    [1.0, 1.0, 1.0]
    """
    if not grads:
        raise ValueError("grads must hold at least one named array")
    arrays = {}
    for k, v in grads.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"gradient names must be identifiers, got {k!r}")
        a = np.asarray(v)
        if a.dtype.kind != "f":
            raise TypeError(f"grads[{k!r}] must hold floats, got {a.dtype}")
        arrays[k] = a
    p = Path(path)
    p = p if p.suffix == ".npz" else p.with_name(p.name + ".npz")
    # what np.savez_compressed writes, with a fixed time stamp: the same bytes every run
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for k, a in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, a, allow_pickle=False)
            info = zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())
    return p


def load_gradients(path: str | Path) -> dict[str, np.ndarray]:
    """Load the arrays written by :func:`save_gradients`."""
    with np.load(Path(path), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
