"""Walsh-Hadamard rotations: the blockwise (random) Hadamard transform of the FP4 recipes.

:func:`hadamard` applies the orthonormal Walsh-Hadamard transform of size ``n`` (a power of two,
2..4096; the recipes use 16..256) to consecutive blocks of ``n`` values along an axis, optionally
after a seeded random sign flip (the *random Hadamard transform* of QuaRot, Quartet and
Transformer Engine's NVFP4 recipe), and its inverse:

* forward: ``y = c * H_n @ (s * x)`` for every block ``x``;
* inverse: ``x = s * (c * H_n @ y)`` (``H_n`` is symmetric and ``H_n @ H_n = n I``),

where ``H_n`` is Sylvester's ``+-1`` matrix in natural order (``H_1 = [1]``,
``H_2n = [[H_n, H_n], [H_n, -H_n]]``, :func:`hadamard_matrix`), ``c = n**-0.5`` makes it
orthonormal, and ``s`` is the sign vector of :func:`random_signs` (all ones when ``seed`` is None).
The same ``s`` serves every block, as in the recipes.

The product ``H_n v`` is the fast transform (``n log2 n`` additions): stages ``h = 1, 2, ...,
n/2``, each replacing the pair ``(v[j], v[j + h])`` of every group of ``2h`` by ``(v[j] + v[j + h],
v[j] - v[j + h])``. How the arithmetic is done is the ``arithmetic`` option:

``"exact"`` (float64 result)
    ``H_n s x`` is the exact value, correctly rounded to float64 once. It is computed with float64
    butterflies wherever that is exact: in a block whose non-zero finite values are all multiples
    of ``2**L`` and below ``2**M`` in magnitude, every partial sum is a multiple of ``2**L`` below
    ``2**(M + log2 n)``, so float64 (53 bits) holds it exactly iff ``M + log2(n) - L <= 53``; e.g.
    float32 data (24-bit significands) whose magnitudes within a block span at most
    ``2**(29 - log2 n)`` (``2**21`` for n = 256), and every bf16 or fp16 tensor with moderate range.
    Other blocks (full float64 data, wide ranges) are computed in Python integers, exactly. Then
    ``c``: for ``n = 4**k`` (16, 64, 256) it is ``2**-k`` and applied in the same single rounding
    (the result is the exact orthonormal transform correctly rounded to float64); for
    ``n = 2 * 4**k`` (32, 128) ``c = 2**-k * fl64(2**-0.5)`` is one more float64 multiply
    (relative error at most about ``2**-52``). Blocks holding an infinity or NaN follow IEEE
    float64 arithmetic.
a float format: ``"fp32"``, ``"bf16"``, ... (float32 result within float32, else float64)
    as a kernel computes it: ``x`` is first rounded to the format (nearest-even), then every
    butterfly addition and subtraction and the final multiply by ``c_f`` (``c`` rounded to the
    format to nearest even: exact for n = 4**k) is the exact result rounded once to the format
    by the rounding core (:func:`~precision_lab.core.exact.round_sum`) in the mode ``rounding``
    (any mode; overflow per IEEE 754). Stochastic rounding at stage ``t`` (``t = 0 .. log2 n - 1``;
    ``log2 n`` for the multiply by ``c_f``) draws for element ``i`` (its C-order flat index with the
    blocked axis moved last) the core's random word ``t * N + i`` of ``rounding_seed`` (``N``
    elements in all). The sign flips are exact. With ``"fp32"`` and ``"nearest_even"`` on float32
    data the native backend runs the same operations in compiled float32 arithmetic
    (``backends/native/hadamard.inc``), bit for bit the same.

So ``hadamard(x, arithmetic="bf16") - hadamard(x)`` is the transform's own rounding error.

>>> import numpy as np
>>> x = np.arange(16, dtype=np.float32)
>>> y = hadamard(x, block=16)
>>> y[:3]
array([30., -2., -4.])
>>> bool((hadamard(y, block=16, inverse=True) == x).all())
True
>>> z = hadamard(x, block=16, seed=7, arithmetic="fp32")
>>> z.dtype, bool(np.allclose(hadamard(z, block=16, seed=7, inverse=True), x, atol=1e-5))
(dtype('float32'), True)
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..backends.native import kernels as native_kernels
from ..core.exact import Rounder, round_sum, stochastic_words, two_product_error, two_sum
from ..core.formats import FloatFormat, get_format
from ..core.random_words import check_seed, random_words
from ..core.rounding import (
    STOCHASTIC_MODES,
    _fits_float32,
    as_float_array,
    check_random_bits,
    check_rounding,
    for_chunks,
    round_to,
)

__all__ = ["TE_NVFP4_SIGNS", "hadamard", "hadamard_matrix", "random_signs"]

#: block sizes accepted by :func:`hadamard` (the recipes use 16..256)
MIN_BLOCK, MAX_BLOCK = 2, 4096

#: Transformer Engine's fixed sign vector of its 16-point random Hadamard transform (NVFP4
#: recipe, weight-gradient GEMM): ``get_wgrad_sign_vector()`` in
#: ``transformer_engine/pytorch/tensor/nvfp4_tensor.py`` (NVIDIA/TransformerEngine, commit
#: 01634950ba17e76ef8c73ef36039ea4588ef50fb; the same tuple in
#: ``transformer_engine/jax/quantize/hadamard.py``). TE builds ``diag(signs) @ H_16 / 4`` and
#: multiplies row vectors by it: ``x @ diag(s) H / 4 = H (s * x) / 4`` (H is symmetric), which is
#: ``hadamard(x, block=16, signs=TE_NVFP4_SIGNS)``.
TE_NVFP4_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def _check_block(block: Any, name: str = "block") -> int:
    """A rotation size: an int, a power of two from MIN_BLOCK to MAX_BLOCK (errors name it as
    ``name``)."""
    if isinstance(block, bool) or not isinstance(block, int | np.integer):
        raise TypeError(f"{name} must be an int (a power of two), got {block!r}")
    n = int(block)
    if not (MIN_BLOCK <= n <= MAX_BLOCK and n & (n - 1) == 0):
        raise ValueError(
            f"{name} must be a power of two from {MIN_BLOCK} to {MAX_BLOCK}, got {block!r}"
        )
    return n


def hadamard_matrix(n: int) -> np.ndarray:
    """Sylvester's Walsh-Hadamard matrix ``H_n`` in natural order (int8 entries +-1).

    >>> hadamard_matrix(4)
    array([[ 1,  1,  1,  1],
           [ 1, -1,  1, -1],
           [ 1,  1, -1, -1],
           [ 1, -1, -1,  1]], dtype=int8)
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1 or n & (n - 1):
        raise ValueError(f"n must be a positive power of two, got {n!r}")
    h = np.ones((1, 1), dtype=np.int8)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def random_signs(n: int, seed: int) -> np.ndarray:
    """The random sign vector of the random Hadamard transform (float64, entries +-1).

    Sign ``i`` is ``-1`` where the top bit of the core's random word ``i`` of ``seed``
    (:func:`~precision_lab.core.random_words.random_words`, Philox4x64-10 keyed by the seed) is
    set: the same on every machine and backend.

    >>> random_signs(8, 0).tolist()
    [1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0]
    """
    return _signs(int(n), check_seed(seed)).copy()


@functools.lru_cache(maxsize=256)
def _signs(n: int, key: int) -> np.ndarray:
    """:func:`random_signs` of a checked seed, kept (read-only): a model's rotations draw the
    same few vectors every step (random_words cost ~10 us per draw)."""
    top = random_words(key, n) >> np.uint64(63)
    signs = np.where(top == 1, -1.0, 1.0)
    signs.flags.writeable = False
    return signs


def _arith_format(arithmetic: Any) -> FloatFormat | None:
    if isinstance(arithmetic, str) and arithmetic.strip().lower() == "exact":
        return None
    try:
        f = get_format(arithmetic, name="arithmetic")
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"arithmetic must be 'exact' or a floating-point format name, got {arithmetic!r} ({e})"
        ) from None
    if not isinstance(f, FloatFormat):
        raise ValueError(f"arithmetic must be 'exact' or a floating-point format, got {f}")
    return f


def hadamard(
    x: Any,
    *,
    block: int = 16,
    axis: int = -1,
    seed: int | None = None,
    inverse: bool = False,
    arithmetic: str | FloatFormat = "exact",
    rounding: str = "nearest_even",
    rounding_seed: int | None = None,
    random_bits: int | None = None,
    signs: Any = None,
) -> np.ndarray:
    """The orthonormal (random) Walsh-Hadamard transform of blocks of ``block`` values on ``axis``.

    Parameters
    ----------
    x:
        Array-like of floats (integer input is a TypeError); never modified. The length of
        ``axis`` must be a multiple of ``block``.
    block:
        Transform size ``n``: a power of two from 2 to 4096 (16..256 in the recipes).
    axis:
        The axis cut into blocks of ``n`` consecutive values.
    seed:
        Seed of the random sign vector (:func:`random_signs`; the random Hadamard transform);
        None: no sign flips (the plain transform).
    signs:
        A given sign vector instead of ``seed``'s: ``block`` entries, each +1 or -1 (e.g.
        :data:`TE_NVFP4_SIGNS`, Transformer Engine's fixed 16 signs); the same for every block.
        Passing both ``seed`` and ``signs`` is a ValueError.
    inverse:
        Apply the inverse: ``s * (c * H_n @ y)`` (with the same ``seed``).
    arithmetic:
        ``"exact"`` or a float format (``"fp32"``, ``"bf16"``, ...): see the module docstring.
    rounding, rounding_seed, random_bits:
        The rounding mode of the arithmetic's operations (a format only; any mode of
        :func:`~precision_lab.round_to`), and for stochastic rounding the seed of its random words
        and their number of bits.

    Returns
    -------
    An array of ``x``'s shape: float64 for ``"exact"``; for a format, float32 when its values fit
    float32 (fp32, bf16, fp16, fp8 ...), float64 otherwise.

    >>> import numpy as np
    >>> x = np.ones(32)
    >>> hadamard(x, block=16)[:2], hadamard(x, block=16)[16:18]
    (array([4., 0.]), array([4., 0.]))
    >>> hadamard([1.0, 2.0**-30] * 8, block=16, arithmetic="bf16")[:2]  # exact: 2 +- 2**-29
    array([2., 2.], dtype=float32)
    """
    n = _check_block(block)
    fmt = _arith_format(arithmetic)
    mode = check_rounding(rounding)
    if fmt is None and (mode != "nearest_even" or rounding_seed is not None):
        raise ValueError(
            f"rounding={rounding!r} and rounding_seed need arithmetic='fp32' or another format; "
            "arithmetic='exact' rounds once to float64 (nearest even)"
        )
    rbits = check_random_bits(random_bits)
    a = as_float_array(x)
    if a.ndim == 0:
        raise ValueError("x must have at least one dimension to be split into blocks")
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -a.ndim <= axis < a.ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {a.ndim} dimension(s)")
    if a.shape[axis] % n:
        raise ValueError(
            f"the length of axis {axis} of x is {a.shape[axis]}, not a multiple of block={n}"
        )
    if signs is not None:
        if seed is not None:
            raise ValueError("pass seed (random signs) or signs (a given sign vector), not both")
        signs = _check_signs(signs, n)
    elif seed is not None:
        signs = random_signs(n, seed)
    moved = np.moveaxis(a, axis, -1)
    flat = np.ascontiguousarray(moved).reshape(-1, n)
    if fmt is None:
        out = _exact_native32(flat, n, signs, bool(inverse)) if flat.dtype == np.float32 else None
        if out is None:
            quick = _fp32_exact_rows(flat, n) if flat.dtype == np.float32 else None
            out = _exact(flat.astype(np.float64), n, signs, bool(inverse), quick)
    else:
        key = check_seed(rounding_seed) if mode in STOCHASTIC_MODES else 0
        out = _in_format(flat, n, signs, bool(inverse), fmt, mode, key, rbits)
    return np.moveaxis(out.reshape(moved.shape), -1, axis)


def _check_signs(signs: Any, n: int) -> np.ndarray:
    """A given sign vector as float64 +-1 of length ``n``; a ValueError naming what is wrong."""
    try:
        s = np.asarray(signs, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"signs must be {n} numbers, each +1 or -1, got {signs!r:.80}") from None
    if s.shape != (n,):
        raise ValueError(f"signs must have shape ({n},) (one per block element), got {s.shape}")
    bad = (s != 1) & (s != -1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"signs must be +1 or -1, got {float(s[i])!r} at index {i}")
    return s


# ----- the butterfly ----------------------------------------------------------------------------
def _stages(n: int) -> list[int]:
    return [1 << t for t in range(n.bit_length() - 1)]


def _pairs(v: np.ndarray, n: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Views of the (a, b) = (v[j], v[j + h]) halves of stage h, shape (rows, n / 2h, h)."""
    z = v.reshape(v.shape[0], n // (2 * h), 2, h)
    return z[:, :, 0, :], z[:, :, 1, :]


def _scale_parts(n: int) -> tuple[int, bool]:
    """c = 2**-k (times 2**-0.5 when ``odd``) for n = 2**(2k) or 2**(2k + 1)."""
    lg = n.bit_length() - 1
    return lg // 2, bool(lg % 2)


# ----- exact ------------------------------------------------------------------------------------
def _exact(
    v: np.ndarray,
    n: int,
    signs: np.ndarray | None,
    inverse: bool,
    quick: np.ndarray | None = None,
) -> np.ndarray:
    """float64 rows of n: the exact transform rounded once to float64 (see the module docstring).

    ``quick``: rows already known to pass :func:`_fp64_exact_rows` (from the float32 input's
    exponents, :func:`_fp32_exact_rows`); only the others are checked value by value."""
    k, odd = _scale_parts(n)
    if signs is not None and not inverse:
        v = v * signs
    if quick is None:
        ok = _fp64_exact_rows(v, n)
    else:
        ok = quick.copy()
        rest = np.flatnonzero(~quick)
        if rest.size:
            ok[rest] = _fp64_exact_rows(v[rest], n)
    h_v = _butterfly(v, n)
    with np.errstate(all="ignore"):
        # exact sums: one rounding (subnormal results) of the exact value; a product with the
        # power of two 2**-k is that one rounding, as np.ldexp (ten times slower) gives it
        out = h_v * np.float64(2.0**-k)
    bad = np.flatnonzero(~ok)
    if bad.size:
        out[bad] = _exact_rows(v[bad], n, k)
    if odd:
        with np.errstate(all="ignore"):
            out = out * np.float64(2.0**-0.5)
    if signs is not None and inverse:
        out = out * signs
    return out


def _exact_native32(
    x: np.ndarray, n: int, signs: np.ndarray | None, inverse: bool
) -> np.ndarray | None:
    """:func:`_exact` of float32 rows ``x`` (rows, n) on the native kernel
    (``hadamard_exact64``, backends/native/hadamard.inc), or None where it is not built.

    The kernel computes, in one pass, the float64 butterflies of ``signs * x`` (forward) or of
    ``x`` (inverse), each addition and subtraction the one :func:`_butterfly` makes, and flags
    the rows that :func:`_fp32_exact_rows` finds exact and that hold no infinity or NaN: for
    those the result is :func:`_exact`'s (the same float64 operations on the same finite
    values, then the same scaling here). The other rows go through :func:`_exact` itself (each
    row is computed on its own there). The numpy passes took 1.3 ms for a (512, 128) float32
    operand and 16-point blocks, the kernel 0.3 (this Xeon).
    """
    ext = native_kernels.ext if native_kernels.active() else None
    if ext is None or not hasattr(ext, "hadamard_exact64"):
        return None
    rows = x.shape[0]
    x = np.ascontiguousarray(x)
    h = np.empty((rows, n), dtype=np.float64)
    ok = np.empty(rows, dtype=np.uint8)
    sg = None if signs is None or inverse else np.ascontiguousarray(signs, dtype=np.float64)
    for_chunks(
        rows,
        lambda lo, hi: ext.hadamard_exact64(x, h, ok, n, sg, lo, hi),
        chunk=max(1, (1 << 18) // n),
    )
    k, odd = _scale_parts(n)
    with np.errstate(all="ignore"):
        out = h * np.float64(2.0**-k)  # (as _exact: one rounding, subnormal results)
        if odd:
            out = out * np.float64(2.0**-0.5)
        if signs is not None and inverse:
            out = out * signs
    rest = np.flatnonzero(ok == 0)
    if rest.size:
        sub = x[rest]
        out[rest] = _exact(sub.astype(np.float64), n, signs, inverse, _fp32_exact_rows(sub, n))
    return out


def _rotation32(x: Any, n: int, axis: int, seed: int | None) -> np.ndarray:
    """A recipe's rotation of ``x`` along ``axis``: zero-padded to a multiple of ``n`` (zeros
    add nothing to a GEMM whose other operand is rotated alike), the exact random Hadamard
    transform (signs of ``seed``; None: none) rounded to float64, then to float32: the bits of
    ``hadamard(x, block=n, axis=axis, seed=seed).astype(np.float32)``.

    Float32 ``x`` takes one native pass (``hadamard_exact32`` in backends/native/hadamard.inc)
    along any axis, without moving the axis last and back and without a float64 result; the
    blocks it flags (not provably exact in float64 butterflies, or holding inf or NaN) are
    recomputed by :func:`_exact`. A (512, 512) float32 operand along axis 0 with 16-point
    blocks: 1.7-3.8 ms through :func:`hadamard` and ``astype``, 0.67 ms here (an AMD EPYC Zen 3,
    the same runs).

    >>> _rotation32(np.ones((4, 2), np.float32), 4, 0, None)[:, 0].tolist()
    [2.0, 0.0, 0.0, 0.0]
    """
    n = _check_block(n)
    a = np.asarray(x)
    length = a.shape[axis]
    if length % n:
        width = [(0, 0)] * a.ndim
        width[axis] = (0, -length % n)
        a = np.pad(a, width)
    ext = native_kernels.ext if native_kernels.active() else None
    if ext is None or a.dtype != np.float32 or a.size == 0 or not hasattr(ext, "hadamard_exact32"):
        return np.asarray(hadamard(a, block=n, axis=axis, seed=seed).astype(np.float32))
    signs = None if seed is None else _signs(n, check_seed(seed))
    x32 = np.ascontiguousarray(a)
    cols = math.prod(a.shape[axis % a.ndim + 1 :])
    out = np.empty_like(x32)
    flags = np.empty(x32.size // n, dtype=np.uint8)
    k, odd = _scale_parts(n)
    for_chunks(
        flags.size,
        lambda lo, hi: ext.hadamard_exact32(
            x32, out, flags, n, cols, signs, 0, int(odd), 2.0**-k, 2.0**-0.5, lo, hi
        ),
        chunk=max(8, (1 << 18) // n),
    )
    bad = np.flatnonzero(flags == 0)
    if bad.size:  # (rows of these blocks, recomputed one by one in _exact)
        r, c = np.divmod(bad, cols)
        sub = x32.reshape(-1, n, cols)[r, :, c]  # (blocks, n)
        rows = _exact(sub.astype(np.float64), n, signs, False, _fp32_exact_rows(sub, n))
        out.reshape(-1, n, cols)[r, :, c] = rows.astype(np.float32)
    return out


def _butterfly(v: np.ndarray, n: int) -> np.ndarray:
    """``H_n`` times every row of ``v`` (rows, n) in its float64 butterflies (stages h = 1, 2,
    ..., n/2: the same additions as the module docstring's). The rows run along the contiguous
    axis (``v`` transposed once), so each stage is two ufunc calls over runs of ``h * rows``
    values written into a second buffer (with the rows across, runs of ``h`` values: one for
    the first stage).

    >>> _butterfly(np.arange(4.0)[None], 4).tolist()
    [[6.0, -2.0, -4.0, 0.0]]
    """
    rows = v.shape[0]
    src = np.array(v.T, dtype=np.float64, order="C")  # (n, rows); v itself is never written
    dst = np.empty_like(src)
    with np.errstate(all="ignore"):
        for h in _stages(n):
            zs = src.reshape(n // (2 * h), 2, h * rows)
            zd = dst.reshape(n // (2 * h), 2, h * rows)
            np.add(zs[:, 0], zs[:, 1], out=zd[:, 0])
            np.subtract(zs[:, 0], zs[:, 1], out=zd[:, 1])
            src, dst = dst, src
    return np.ascontiguousarray(src.T)


def _fp32_exact_rows(x: np.ndarray, n: int) -> np.ndarray:
    """Rows of float32 ``x`` (rows, n) whose float64 butterfly is exact, from the exponent
    fields alone (a sufficient condition of :func:`_fp64_exact_rows`): a float32 number with
    biased exponent ``E`` (1 for subnormals) lies below ``2**(E - 126)`` and is a multiple of
    ``2**(E - 150)``, so a row whose non-zero finite values have ``max E - min E <= 29 -
    log2(n)`` has every partial sum a multiple of ``2**L`` below ``2**(M + log2 n)`` with
    ``M + log2 n - L <= 53``. Rows holding inf or NaN count as exact (IEEE arithmetic), as in
    :func:`_fp64_exact_rows`; rows that fail here may still pass there.

    >>> _fp32_exact_rows(np.array([[1.0, 2.0**-20], [1.0, 2.0**-30]], np.float32), 2).tolist()
    [True, False]
    """
    bits = np.ascontiguousarray(x).view(np.int32).reshape(-1, n)
    e = (bits >> 23) & 0xFF
    special = (e == 0xFF).any(axis=1)
    nz = (bits & 0x7FFFFFFF) != 0
    e = np.maximum(e, 1)
    hi = np.where(nz, e, 0).max(axis=1)
    lo = np.where(nz, e, 0xFF).min(axis=1)
    lg = n.bit_length() - 1
    return np.asarray(special | ~nz.any(axis=1) | (hi - lo <= 29 - lg))


def _fp64_exact_rows(v: np.ndarray, n: int) -> np.ndarray:
    """Rows whose float64 butterfly is exact (or which hold an infinity or NaN: IEEE arithmetic)."""
    finite = np.isfinite(v)
    nz = finite & (v != 0)
    mant, e = np.frexp(np.where(nz, v, 1.0))  # v = mant * 2**e, 0.5 <= |mant| < 1
    mi = np.abs(mant * 2.0**53).astype(np.int64)  # integer significand (53 bits)
    low = mi & -mi  # its lowest set bit, a power of two
    tz = np.frexp(low.astype(np.float64))[1] - 1
    lsb = np.where(nz, e - 53 + tz, np.iinfo(np.int64).max)
    top = np.where(nz, e, np.iinfo(np.int64).min)
    L, M = lsb.min(axis=1), top.max(axis=1)
    lg = n.bit_length() - 1
    allzero = ~nz.any(axis=1)
    fits = (M + lg - L <= 53) & (M + lg <= 1024)
    return allzero | fits | ~finite.all(axis=1)


def _exact_rows(rows: np.ndarray, n: int, k: int) -> np.ndarray:
    """Finite rows in Python integers: ``H_n row * 2**-k`` correctly rounded to float64.

    Each value is its 53-bit signed significand times a power of two; a row is scaled to
    integers by its smallest such power, the butterfly runs on exact integers (numpy object
    arrays: every row at once), and ``int / int`` is correctly rounded (CPython)."""
    mant, e = np.frexp(rows)  # rows = mant * 2**e, 0.5 <= |mant| < 1 (0: mant = 0)
    sig = (mant * 2.0**53).astype(np.int64)  # exact
    lsb = e.astype(np.int64) - 53
    nz = sig != 0
    low = np.where(nz, lsb, np.iinfo(np.int64).max).min(axis=1)
    low = np.where(nz.any(axis=1), low, 0)[:, None]
    ints = sig.astype(object) << np.where(nz, lsb - low, 0).astype(object)
    h = 1
    while h < n:
        a, b = _pairs(ints, n, h)
        s, d = a + b, a - b
        a[...], b[...] = s, d
        h *= 2
    t = (low - k).astype(object)  # the value is ints * 2**t
    num = ints << np.maximum(t, 0)
    den = np.left_shift(1, np.maximum(-t, 0))
    try:
        return np.true_divide(num, den).astype(np.float64)  # int / int: correctly rounded
    except OverflowError:  # past float64's max somewhere: value by value
        out = np.empty(rows.shape)
        for i, j in np.ndindex(*rows.shape):
            m, q = num[i, j], den[i, 0]
            try:
                out[i, j] = m / q
            except OverflowError:
                out[i, j] = math.inf if m > 0 else -math.inf  # (m itself may not fit a float)
        return out


# ----- in a format ------------------------------------------------------------------------------
def _in_format(
    flat: np.ndarray,
    n: int,
    signs: np.ndarray | None,
    inverse: bool,
    fmt: FloatFormat,
    mode: str,
    key: int,
    rbits: int,
) -> np.ndarray:
    k, odd = _scale_parts(n)
    c = 2.0**-k * (2.0**-0.5 if odd else 1.0)
    c_f = float(round_to(np.float64(c), fmt))
    fp32 = fmt == get_format("fp32")
    # the input as the kernel holds it (nearest-even; float32 data already is fp32)
    x = flat if fp32 and flat.dtype == np.float32 else round_to(flat, fmt)
    wdt = np.float32 if _fits_float32(fmt) else np.float64
    x = x.astype(wdt, copy=False)  # exact: its values are on the format's grid
    ext = native_kernels.ext if native_kernels.active() else None
    if ext is not None and mode == "nearest_even" and fp32 and x.dtype == np.float32 and x.size:
        return _native(ext, np.ascontiguousarray(x), n, signs, inverse, c_f)
    v = x.astype(np.float64)
    if signs is not None and not inverse:
        v = v * signs
    r = Rounder(fmt, mode, "ieee", "keep", key, rbits)
    total = v.size
    for t, h in enumerate(_stages(n)):
        a, b = _pairs(v, n, h)
        words = _words(mode, key, t, total, rbits)
        with np.errstate(all="ignore"):
            s1, t1 = two_sum(a, b)
            s2, t2 = two_sum(a, -b)
        s_new = _round_pair(s1, t1, r, words, n, h, 0)
        d_new = _round_pair(s2, t2, r, words, n, h, 1)
        a[...], b[...] = s_new, d_new
    words = _words(mode, key, len(_stages(n)), total, rbits)
    with np.errstate(all="ignore"):
        p = v * c_f
        fin = np.isfinite(p)
        cv = np.full_like(v, c_f)
        e = np.where(fin, two_product_error(np.where(fin, v, 0.0), cv, np.where(fin, p, 0.0)), 0)
    v = round_sum(p, e, r, None if words is None else words.reshape(p.shape))
    if signs is not None and inverse:
        v = v * signs
    return v.astype(wdt)


def _words(mode: str, key: int, t: int, total: int, rbits: int) -> np.ndarray | None:
    if mode not in STOCHASTIC_MODES:
        return None
    return stochastic_words(key, t, total, (total,), rbits if rbits < 64 else None)


def _round_pair(
    s: np.ndarray, t: np.ndarray, r: Rounder, words: np.ndarray | None, n: int, h: int, half: int
) -> np.ndarray:
    """Round the exact s + t of one half of a stage; words of the elements' flat indices."""
    t = np.where(np.isfinite(s), t, 0.0)  # two_sum of infinities: t is NaN
    w = None
    if words is not None:
        w = words.reshape(-1, n // (2 * h), 2, h)[:, :, half, :]
    return round_sum(s, t, r, w)


def _native(
    ext: Any, x: np.ndarray, n: int, signs: np.ndarray | None, inverse: bool, c: float
) -> np.ndarray:
    rows = x.shape[0]
    out = np.empty_like(x)
    sg = None if signs is None else signs.astype(np.float32)
    chunk = max(1, (1 << 18) // n)
    for_chunks(
        rows,
        lambda lo, hi: ext.hadamard(x, out, n, sg, int(inverse), c, lo, hi),
        chunk=chunk,
    )
    return out
