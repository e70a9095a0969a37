"""FP4-era studies: the published error numbers of NVFP4/MXFP4/MXFP8 recipes, recomputed.

* :func:`quartet2_numbers`: the relative quadratic errors (and effective bits) of Quartet II
  (Panferov et al., arXiv 2601.22813) on standard normal data: NVFP4 with round to nearest,
  Four Over Six, 16x16 blocks, and after a 128-point random Hadamard rotation with round to
  nearest and with stochastic rounding.
* :func:`recipe_training`: the digits MLP trained under each recipe (FP32, BF16, MXFP8, NVFP4,
  MXFP4 ...) on the same seeds: final test accuracy and loss per seed.
* :func:`mx_scale_rule_numbers`: the MX scale rules (OCP floor, ceil, torchao's EVEN and RCEIL) on
  standard normal blocks of 32: the fraction of blocks each clips and the QSNR each gives, for
  MXFP4 and MXFP8 (E4M3).

Everything is a pure function of its seed (numpy's PCG64 for the data, the core's Philox words
for the signs and stochastic rounding): the same numbers on every machine.
:func:`markdown` renders both as the report's tables.

>>> r = mx_scale_rule_numbers(blocks=256)
>>> sorted(r["mxfp4_e2m1"]), r["mxfp4_e2m1"]["ceil"]["clipped"]
(['ceil', 'floor', 'nearest_even', 'rceil'], 0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..analysis.measures import quant_error
from ..quant.blocks import clipped_fraction, get_block_format, round_to_blocks
from ..quant.hadamard import hadamard
from ..training import RUNS, train_seeds
from ..training.recipe_model import recipe_model

__all__ = [
    "MX_RULES",
    "QUARTET2_PUBLISHED",
    "Number",
    "markdown",
    "mx_scale_rule_numbers",
    "quartet2_numbers",
    "recipe_training",
]

#: Quartet II's Table (arXiv 2601.22813): relative quadratic error on N(0, 1) and its effective
#: bits (None where the paper gives none)
QUARTET2_PUBLISHED: dict[str, tuple[float, float | None]] = {
    "nvfp4_rtn": (9.0e-3, 3.394),
    "nvfp4_4over6": (7.6e-3, 3.524),
    "nvfp4_16x16": (12.4e-3, 3.167),
    "hadamard128_rtn": (9.0e-3, None),
    "hadamard128_sr": (23.5e-3, None),
}

#: what each Quartet II row is, in precision_lab's terms
QUARTET2_SETTINGS = {
    "nvfp4_rtn": "nvfp4 (16 x E2M1, E4M3 scales, 448*6 tensor scale), round to nearest even",
    "nvfp4_4over6": "nvfp4 with scale_rule='4over6_mse' (256*6 tensor scale)",
    "nvfp4_16x16": "nvfp4_16x16 (16x16 tiles), round to nearest even",
    "hadamard128_rtn": "hadamard(block=128, seed) exact, then nvfp4 round to nearest even",
    "hadamard128_sr": "hadamard(block=128, seed) exact, then nvfp4 stochastic rounding",
}

#: the MX scale rules compared by :func:`mx_scale_rule_numbers`
MX_RULES = ("floor", "ceil", "nearest_even", "rceil")


@dataclass(frozen=True)
class Number:
    """A measured relative quadratic error with its effective bits and sampling standard error
    (the spread of the RQE over 16 equal row slices of the data, divided by 4)."""

    rqe: float
    effective_bits: float
    stderr: float


def _number(q: np.ndarray, x: np.ndarray) -> Number:
    e = quant_error(q, x)
    parts = [
        quant_error(a, b).rqe
        for a, b in zip(np.array_split(q, 16), np.array_split(x, 16), strict=True)
    ]
    return Number(float(e.rqe), float(e.effective_bits), float(np.std(parts, ddof=1) / 4.0))


def quartet2_numbers(*, seed: int = 0, shape: tuple[int, int] = (1024, 1024)) -> dict[str, Number]:
    """Quartet II's quantization errors of N(0, 1) data, recomputed (keys of
    :data:`QUARTET2_PUBLISHED`; settings in :data:`QUARTET2_SETTINGS`).

    ``x`` is float32 standard normal data from ``numpy.random.default_rng(seed)``; the rotation's
    signs use ``seed`` too and stochastic rounding the seed ``seed + 1``. The rotated rows are
    compared with the rotated data (the rotation is orthonormal, so this is the error after
    rotating back, up to float64 rounding).

    >>> r = quartet2_numbers(shape=(64, 256))
    >>> round(r["nvfp4_rtn"].rqe, 4), r["nvfp4_4over6"].rqe < r["nvfp4_rtn"].rqe
    (0.0089, True)
    """
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    out = {
        "nvfp4_rtn": _number(round_to_blocks(x, "nvfp4"), x),
        "nvfp4_4over6": _number(round_to_blocks(x, "nvfp4_4over6"), x),
        "nvfp4_16x16": _number(round_to_blocks(x, "nvfp4_16x16"), x),
    }
    h = hadamard(x, block=128, seed=seed).astype(np.float32)  # |error| <= 2**-24 relative
    out["hadamard128_rtn"] = _number(round_to_blocks(h, "nvfp4"), h)
    sr = round_to_blocks(h, "nvfp4", rounding="stochastic", seed=seed + 1)
    out["hadamard128_sr"] = _number(sr, h)
    return out


def mx_scale_rule_numbers(*, seed: int = 0, blocks: int = 65536) -> dict[str, dict[str, Any]]:
    """Per MX element format (``mxfp4_e2m1``, ``mxfp8_e4m3``) and scale rule of
    :data:`MX_RULES`: ``clipped`` (fraction of blocks whose amax saturates,
    :func:`~precision_lab.quant.blocks.clipped_fraction`), ``qsnr_db`` and ``rqe``, on ``blocks``
    blocks of 32 float32 standard normal values (``numpy.random.default_rng(seed)``), round to
    nearest even."""
    x = np.random.default_rng(seed).standard_normal((blocks, 32)).astype(np.float32)
    res: dict[str, dict[str, Any]] = {}
    for name in ("mxfp4_e2m1", "mxfp8_e4m3"):
        res[name] = {}
        for rule in MX_RULES:
            bf = get_block_format(name, scale_rule=rule)
            e = quant_error(round_to_blocks(x, bf), x)
            res[name][rule] = {
                "clipped": clipped_fraction(x, bf),
                "qsnr_db": float(e.qsnr_db),
                "rqe": float(e.rqe),
            }
    return res


def markdown(
    q2: dict[str, Number] | None = None, mx: dict[str, dict[str, Any]] | None = None
) -> str:
    """The report's two tables (computed with the defaults when not given)."""
    q2 = quartet2_numbers() if q2 is None else q2
    mx = mx_scale_rule_numbers() if mx is None else mx
    lines = [
        "| Quartet II row | setting | RQE (ours) | eff. bits | RQE (paper) | bits (paper) |",
        "|---|---|---|---|---|---|",
    ]
    for k, (pub, bits) in QUARTET2_PUBLISHED.items():
        n = q2[k]
        pb = "" if bits is None else f"{bits:.3f}"
        lines.append(
            f"| {k} | {QUARTET2_SETTINGS[k]} | {n.rqe * 1e3:.2f}e-3 (+-{n.stderr * 1e3:.2f}) | "
            f"{n.effective_bits:.3f} | {pub * 1e3:.1f}e-3 | {pb} |"
        )
    lines += ["", "| format | rule | clipped blocks | QSNR (dB) |", "|---|---|---|---|"]
    for name, rules in mx.items():
        for rule, v in rules.items():
            lines.append(f"| {name} | {rule} | {v['clipped']:.4f} | {v['qsnr_db']:.3f} |")
    return "\n".join(lines)


def _isclose_published(value: float, published: float, digits: int, stderr: float) -> bool:
    """Within half a unit of the published last digit plus three standard errors."""
    return abs(value - published) <= 0.5 * 10.0**-digits + 3 * stderr + 1e-15 * math.fabs(value)


def recipe_training(
    recipes: tuple[str, ...] = (
        "fp32",
        "bf16",
        "te_mxfp8",
        "te_nvfp4",
        "fp4_all_the_way",
        "quartet",
    ),
    *,
    seeds: tuple[int, ...] = (0, 1),
    epochs: int = 10,
) -> dict[str, dict[str, list[float]]]:
    """Final test accuracy and training loss per seed of the digits MLP (``RUNS["fp32"]``: fp32
    storage, SGD with momentum) trained ``epochs`` epochs with each recipe's GEMMs
    (:class:`~precision_lab.training.recipe_model.RecipeMLP`); the same seeds (data split,
    initial weights, batch order) for every recipe."""
    cfg = RUNS["fp32"].replace(epochs=epochs)
    out: dict[str, dict[str, list[float]]] = {}
    for name in recipes:
        runs = train_seeds(cfg, list(seeds), model=recipe_model(name))
        out[name] = {
            "test_acc": [float(r.test_acc[-1]) for r in runs],
            "train_loss": [float(r.train_loss[-1]) for r in runs],
        }
    return out
