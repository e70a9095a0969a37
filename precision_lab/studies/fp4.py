"""FP4-era studies: the published error numbers of NVFP4/MXFP4/MXFP8 recipes, recomputed.

* :func:`quartet2_numbers`: the relative quadratic errors (and effective bits) of Quartet II
  (Panferov et al., arXiv 2601.22813) on standard normal data: NVFP4 with round to nearest,
  Four Over Six, 16x16 blocks, and after a 128-point random Hadamard rotation with round to
  nearest and with stochastic rounding (the latter with the scale convention of Quartet II's
  code, :func:`nvfp4_quartet2_code`: block amax mapped to 6 * 16/17).
* :func:`recipe_training`: the digits MLP trained under each recipe (FP32, BF16, MXFP8, NVFP4,
  MXFP4 ...) on the same seeds: final test accuracy and loss per seed.
* :func:`mx_scale_rule_numbers`: the MX scale rules (OCP floor, ceil, torchao's EVEN and RCEIL) on
  standard normal blocks of 32: the fraction of blocks each clips and the QSNR each gives, for
  MXFP4 and MXFP8 (E4M3).

* :func:`quartet2_sr_attempts`: the settings tried to reproduce Quartet II's stochastic-rounding
  error (23.5e-3): fewer random bits, no rotation, Four Over Six, 16x16 tiles, per-block
  averaging, block maxima mapped below 6, and the convention of Quartet II's code (block amax
  mapped to 6 * 16/17), the one that gives the published value.

Everything is a pure function of its seed (numpy's PCG64 for the data, the core's Philox words
for the signs and stochastic rounding), and the sums of squares are :func:`math.fsum` (exact,
then rounded once; no BLAS dot product, whose order depends on the library and the threads):
the same numbers on every machine.
:func:`markdown` renders both as the report's tables.

>>> r = mx_scale_rule_numbers(blocks=256)
>>> sorted(r["mxfp4_e2m1"]), r["mxfp4_e2m1"]["ceil"]["clipped"]
(['ceil', 'floor', 'nearest_even', 'rceil'], 0.0)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.rounding import round_to
from ..quant.blocks import clipped_fraction, get_block_format, round_to_blocks
from ..quant.hadamard import hadamard
from ..quant.recipes import Recipe
from ..training import RUNS, train_seeds
from ..training.recipe_model import recipe_model

__all__ = [
    "MX_RULES",
    "QUARTET2_PUBLISHED",
    "QUARTET2_RTN_OVERRIDE",
    "QUARTET2_SR_HEADROOM",
    "Number",
    "markdown",
    "mx_scale_rule_numbers",
    "nvfp4_quartet2_code",
    "quartet2_code_data",
    "quartet2_numbers",
    "quartet2_sr_attempts",
    "recipe_training",
]

#: Quartet II's Table (arXiv 2601.22813): relative quadratic error on N(0, 1) and its effective
#: bits (None where the paper gives none). Its code (IST-DASLab/Quartet-II,
#: ``notebooks/unbiasedness.ipynb``) computes the two rows after the rotation on rows of 128
#: normal values scaled by 2**0 .. 2**8 (:func:`quartet2_code_data`), as the mean of per-row
#: errors; the error is scale-free, so N(0, 1) data give the same values within sampling error.
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
    "hadamard128_sr": "hadamard(block=128, seed) exact, then NVFP4 stochastic rounding with "
    "Quartet II's code's scales (block amax to 6 * 16/17: `nvfp4_quartet2_code`)",
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


def _sumsq(v: np.ndarray) -> float:
    """``sum(v**2)`` of a float64 array: the squares are IEEE products, their sum is
    :func:`math.fsum` (exact, rounded once), so it is the same on every machine."""
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    return math.fsum((v * v).tolist())


def exact_rqe(q: np.ndarray, x: np.ndarray) -> float:
    """Relative quadratic error ``sum((q - x)**2) / sum(x**2)`` with :func:`math.fsum` sums (the
    value of :func:`~precision_lab.analysis.quant_error` to float64 rounding, and the same bits on
    every machine).

    >>> exact_rqe(np.array([1.0, 2.0]), np.array([1.0, 1.0]))
    0.5
    """
    x64 = np.asarray(x, dtype=np.float64)
    d = np.asarray(q, dtype=np.float64) - x64  # exact for float32 q and x
    return _sumsq(d) / _sumsq(x64)


def _number(q: np.ndarray, x: np.ndarray) -> Number:
    num = [_sumsq(a - b) for a, b in zip(_slices(q), _slices(x), strict=True)]
    den = [_sumsq(b) for b in _slices(x)]
    rqe = math.fsum(num) / math.fsum(den)
    parts = [a / b for a, b in zip(num, den, strict=True)]
    return Number(rqe, -0.5 * math.log2(rqe), statistics.stdev(parts) / 4.0)


def _slices(a: np.ndarray) -> list[np.ndarray]:
    return [p.astype(np.float64) for p in np.array_split(a, 16)]


def quartet2_numbers(*, seed: int = 0, shape: tuple[int, int] = (1024, 1024)) -> dict[str, Number]:
    """Quartet II's quantization errors of N(0, 1) data, recomputed (keys of
    :data:`QUARTET2_PUBLISHED`; settings in :data:`QUARTET2_SETTINGS`; and
    ``hadamard128_rtn_code``: round to nearest after the rotation with the scales of Quartet
    II's code, scale override :data:`QUARTET2_RTN_OVERRIDE`).

    ``x`` is float32 standard normal data from ``numpy.random.default_rng(seed)``; the rotation's
    signs use ``seed`` too and stochastic rounding the seed ``seed + 1``. The rotated rows are
    compared with the rotated data (the rotation is orthonormal, so this is the error after
    rotating back, up to float64 rounding). Stochastic rounding uses the scales of Quartet II's
    code (:func:`nvfp4_quartet2_code`); with NVIDIA's rule (block amax to 6) it gives about
    18.8e-3 instead (:func:`quartet2_sr_attempts`' ``"sr"``).

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
    out["hadamard128_sr"] = _number(nvfp4_quartet2_code(h, seed=seed + 1), h)
    code_rtn = nvfp4_quartet2_code(h, rounding="nearest_away", scale_override=QUARTET2_RTN_OVERRIDE)
    out["hadamard128_rtn_code"] = _number(code_rtn, h)
    return out


def mx_scale_rule_numbers(*, seed: int = 0, blocks: int = 65536) -> dict[str, dict[str, Any]]:
    """Per MX element format (``mxfp4_e2m1``, ``mxfp8_e4m3``) and scale rule of
    :data:`MX_RULES`: ``clipped`` (fraction of blocks whose amax saturates,
    :func:`~precision_lab.quant.blocks.clipped_fraction`), ``qsnr_db`` and ``rqe``, on ``blocks``
    blocks of 32 float32 standard normal values (``numpy.random.default_rng(seed)``), round to
    nearest even."""
    x = np.random.default_rng(seed).standard_normal((blocks, 32)).astype(np.float32)
    x64 = x.astype(np.float64)
    den = _sumsq(x64)
    res: dict[str, dict[str, Any]] = {}
    for name in ("mxfp4_e2m1", "mxfp8_e4m3"):
        res[name] = {}
        for rule in MX_RULES:
            bf = get_block_format(name, scale_rule=rule)
            rqe = _sumsq(round_to_blocks(x, bf).astype(np.float64) - x64) / den
            res[name][rule] = {
                "clipped": clipped_fraction(x, bf),
                "qsnr_db": -10.0 * math.log10(rqe),
                "rqe": rqe,
            }
    return res


#: what each of :func:`quartet2_sr_attempts`' settings is
SR_ATTEMPTS = {
    "sr": "nvfp4 SR after the 128-point rotation, NVIDIA's rule (block amax to 6)",
    "sr_bits8": "the same with 8 random bits per rounding",
    "sr_bits4": "the same with 4 random bits per rounding",
    "sr_no_rotation": "nvfp4 SR of the unrotated data",
    "sr_4over6": "nvfp4_4over6 SR after the rotation",
    "sr_16x16": "nvfp4_16x16 SR after the rotation",
    "sr_block_mean": "nvfp4 SR after the rotation, RQE averaged per block of 16",
    "sr_max_4.5": "block amax mapped to 4.5 (a 3/4 pre-scale against SR overflow), E4M3 scales",
    "sr_max_4": "block amax mapped to 4, E4M3 scales",
    "sr_headroom_17_16": "Quartet II's code: block amax mapped to 6 * 16/17, tensor amax to "
    "447.99 * 6 * 16/17 (`nvfp4_quartet2_code`)",
    "sr_quartet2_code": "the same on the code's data (rows of 128 scaled 2**0..2**8, plain "
    "Sylvester Hadamard), mean of the per-row RQE",
}

#: Quartet II's code (IST-DASLab/Quartet-II, ``sr_1x16s_fp4_kernel`` and
#: ``EdenSRQuantizer``): every NVFP4 quantizer of its E4M3 path divides 6 by ``17/16`` times a
#: scale override (1 for stochastic rounding, 0.93 for round to nearest), so a block's amax
#: maps to ``6 * 16/17`` (rounding the block scale to E4M3, 3 mantissa bits, raises a scaled
#: value by a factor of at most 17/16, back to at most 6: no SR value overflows)
QUARTET2_SR_HEADROOM = 17 / 16
#: the scale override of Quartet II's code for round to nearest with E4M3 scales
#: (``notebooks/unbiasedness.ipynb``): a block's amax maps to ``6 / (0.93 * 17/16) = 6.07``
QUARTET2_RTN_OVERRIDE = 0.93


def nvfp4_quartet2_code(
    x: np.ndarray,
    *,
    rounding: str = "stochastic",
    scale_override: float = 1.0,
    seed: int | None = None,
) -> np.ndarray:
    """NVFP4 fake quantization (blocks of 16 along the last axis) as Quartet II's code does it
    (:data:`QUARTET2_SR_HEADROOM`): ``val_max = 6 / (17/16 * scale_override)``, tensor scale
    ``s_dec = amax / 447.99 / val_max``, block scale ``e4m3(block_amax / val_max / s_dec)``
    (round to nearest even; 0 becomes 1), elements ``x / (scale * s_dec)`` rounded to E2M1
    (``rounding``: ``"stochastic"`` exact SR, or ``"nearest_away"``, the code's thresholds)
    and scaled back. The code's tensor amax is ``torch.amax`` (the largest signed value); on
    symmetric data that is the largest magnitude or a hair below it, and we take the largest
    magnitude. Float64 arithmetic (the code's is float32).

    >>> x = np.linspace(-1.0, 1.0, 32)
    >>> q = nvfp4_quartet2_code(x, rounding="nearest_away")  # amax 1 -> 5.65 -> 6: 6 / 5.65
    >>> round(float(q.max()), 4), q.shape
    (1.0625, (32,))
    """
    b = np.asarray(x, dtype=np.float64).reshape(-1, 16)
    val_max = 6.0 / (QUARTET2_SR_HEADROOM * scale_override)
    amax = float(np.abs(b).max()) if b.size else 0.0
    s_dec = 1.0 if amax == 0.0 else amax / 447.99 / val_max
    sb = round_to(np.abs(b).max(axis=1, keepdims=True) / val_max / s_dec, "e4m3")
    inv = np.where(sb == 0, 1.0, sb.astype(np.float64)) * s_dec
    e = round_to(b / inv, "e2m1", rounding=rounding, overflow="saturate", seed=seed)
    return (e.astype(np.float64) * inv).reshape(np.shape(x))


def quartet2_code_data(*, seed: int = 0, rows: int = 2**13) -> np.ndarray:
    """The data of Quartet II's error table as its code makes it (``notebooks/unbiasedness``:
    ``randn(2**20, 128) * logspace(0, 8, 2**20, base=2)[:, None]``), with ``rows`` rows from
    ``numpy.random.default_rng(seed)``, rotated by the plain (Sylvester, no random signs)
    orthonormal 128-point Hadamard, float32."""
    x = np.random.default_rng(seed).standard_normal((rows, 128))
    x = (x * np.logspace(0, 8, rows, base=2)[:, None]).astype(np.float32)
    return hadamard(x, block=128, seed=None).astype(np.float32)


def _sr_max(h: np.ndarray, target: float, seed: int) -> np.ndarray:
    """NVFP4-like SR with each block of 16's amax mapped to ``target`` instead of 6: scale
    ``amax / target`` rounded to E4M3 (no tensor scale: these amax are far inside E4M3's range),
    elements stochastically rounded to E2M1, saturating."""
    b = h.astype(np.float64).reshape(-1, 16)
    s = round_to(np.abs(b).max(axis=1, keepdims=True) / target, "e4m3").astype(np.float64)
    s = np.where(s == 0, 1.0, s)
    e = round_to(b / s, "e2m1", rounding="stochastic", overflow="saturate", seed=seed)
    return (e.astype(np.float64) * s).reshape(h.shape)


def quartet2_sr_attempts(
    *, seed: int = 0, shape: tuple[int, int] = (512, 1024)
) -> dict[str, Number]:
    """The RQE of stochastic rounding to NVFP4 under each setting of :data:`SR_ATTEMPTS` (data,
    rotation and SR seeds as in :func:`quartet2_numbers`). With NVIDIA's scale rule (block amax
    to 6) exact SR has about twice the RTN error (exact SR of a uniform position between two
    grid points has twice the variance of round to nearest: d**2/6 against d**2/12); Quartet
    II's 23.5e-3 (2.6x) is the convention of its code, ``sr_headroom_17_16`` and
    ``sr_quartet2_code`` (:data:`QUARTET2_SR_HEADROOM`).

    >>> r = quartet2_sr_attempts(shape=(64, 256))
    >>> 1.8 < r["sr"].rqe / quartet2_numbers(shape=(64, 256))["hadamard128_rtn"].rqe < 2.3
    True
    """
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    h = hadamard(x, block=128, seed=seed).astype(np.float32)
    sr: dict[str, Any] = {"rounding": "stochastic", "seed": seed + 1}
    q = round_to_blocks(h, "nvfp4", **sr)
    out = {
        "sr": _number(q, h),
        "sr_bits8": _number(round_to_blocks(h, "nvfp4", random_bits=8, **sr), h),
        "sr_bits4": _number(round_to_blocks(h, "nvfp4", random_bits=4, **sr), h),
        "sr_no_rotation": _number(round_to_blocks(x, "nvfp4", **sr), x),
        "sr_4over6": _number(round_to_blocks(h, "nvfp4_4over6", **sr), h),
        "sr_16x16": _number(round_to_blocks(h, "nvfp4_16x16", **sr), h),
    }
    d = q.astype(np.float64).reshape(-1, 16) - h.astype(np.float64).reshape(-1, 16)
    r = h.astype(np.float64).reshape(-1, 16)
    per = (d * d).sum(axis=1) / (r * r).sum(axis=1)  # 16 terms each: numpy's fixed order
    parts = [math.fsum(p.tolist()) / len(p) for p in np.array_split(per, 16)]
    mean = math.fsum(per.tolist()) / len(per)
    out["sr_block_mean"] = Number(mean, -0.5 * math.log2(mean), statistics.stdev(parts) / 4.0)
    out["sr_max_4.5"] = _number(_sr_max(h, 4.5, seed + 1), h)
    out["sr_max_4"] = _number(_sr_max(h, 4.0, seed + 1), h)
    out["sr_headroom_17_16"] = _number(nvfp4_quartet2_code(h, seed=seed + 1), h)
    c = quartet2_code_data(seed=seed, rows=shape[0] * shape[1] // 128)
    out["sr_quartet2_code"] = _row_mean(nvfp4_quartet2_code(c, seed=seed + 1), c)
    return out


def _row_mean(q: np.ndarray, x: np.ndarray) -> Number:
    """The mean over the rows of the per-row RQE (Quartet II's code's measure), with the
    standard error of 16 row slices' means."""
    d = q.astype(np.float64) - x.astype(np.float64)
    r = x.astype(np.float64)
    per = [_sumsq(a) / _sumsq(b) for a, b in zip(d, r, strict=True)]
    parts = [math.fsum(p) / len(p) for p in np.array_split(np.array(per), 16)]
    mean = math.fsum(per) / len(per)
    return Number(mean, -0.5 * math.log2(mean), statistics.stdev(parts) / 4.0)


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
    recipes: tuple[str | Recipe, ...] = (
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
) -> dict[str, dict[str, Any]]:
    """Per recipe (a name of :data:`~precision_lab.quant.recipes.RECIPES` or a
    :class:`~precision_lab.quant.recipes.Recipe`, keyed by its name): the final test accuracy
    and training loss per seed (``test_acc``, ``train_loss``) and their curves, one value per
    epoch (``test_acc_curve``, ``train_loss_curve``: a list per seed), of the digits MLP
    (``RUNS["fp32"]``: fp32 storage, Adam) trained ``epochs`` epochs with the recipe's GEMMs
    (:class:`~precision_lab.training.recipe_model.RecipeMLP`); the same seeds (data split,
    initial weights, batch order) for every recipe."""
    cfg = RUNS["fp32"].replace(epochs=epochs)
    out: dict[str, dict[str, Any]] = {}
    for recipe in recipes:
        name = recipe if isinstance(recipe, str) else recipe.name
        runs = train_seeds(cfg, list(seeds), model=recipe_model(recipe))
        out[name] = {
            "test_acc": [float(r.test_acc[-1]) for r in runs],
            "train_loss": [float(r.train_loss[-1]) for r in runs],
            "test_acc_curve": [[float(a) for a in r.test_acc] for r in runs],
            "train_loss_curve": [[float(a) for a in r.train_loss] for r in runs],
        }
    return out
