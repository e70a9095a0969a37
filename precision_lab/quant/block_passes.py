"""The passes over the data of a block-scaled cast: chunked numpy passes and the native kernel.

One fused pass per chunk of blocks: amax, scale, exact scaling, the core's rounding kernel, and
scaling back (see :mod:`precision_lab.quant.blocks` for the semantics). ``_elements`` runs it on
the native backend where it covers the case and on numpy otherwise; both give the same bits.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backends.kernel_sources import format_args
from ..backends.native import kernels as native_kernels
from ..core.codec import encode
from ..core.formats import FloatFormat, IntFormat
from ..core.random_words import check_seed
from ..core.rounding import (
    CHUNK,
    ROUNDING_MODES,
    STOCHASTIC_MODES,
    _plan,
    _random_for,
    _round_float_chunk,
    _round_int_chunk,
    as_float_array,
    check_random_bits,
    check_rounding,
    for_chunks,
    round_to,
    sr_mode,
    word_bits,
    working_dtype,
)
from ..core.scratch import scratch
from . import block_layout
from .block_formats import (
    BlockFormat,
)
from .block_layout import (
    _block_amax,
    _Layout,
    _layout,
    _nvfp4_scales,
    _nvfp4_tensor_scale,
    _pow2_exponents,
    _units_per_chunk,
)


# ----- the passes over the data -----------------------------------------------------------------
def _data_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the passes work in for input of ``dtype``: float64 and float32 as they are,
    every other float type as float32."""
    return np.dtype(dtype) if dtype in (np.float64, np.float32) else np.dtype(np.float32)


def _prepare(x: Any, bf: BlockFormat, axis: Any, pad: bool) -> tuple[np.ndarray, _Layout]:
    a = as_float_array(x)
    a = a.astype(_data_dtype(a.dtype), copy=False)
    lay = _layout(a.shape, bf, axis, pad)
    if lay.needs_pad:
        data = np.zeros(lay.padded, dtype=a.dtype)
        data[lay.crop] = a
    else:
        data = np.ascontiguousarray(a)
    return data, lay


def _pow2_fits(p: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every (non-NaN) power of two in ``p`` is a value of ``dtype``."""
    fin = p[~np.isnan(p)]
    info = np.finfo(dtype)
    return bool(((fin >= info.smallest_subnormal) & (fin <= info.max)).all())


def _scratch(dtype: np.dtype, shape: tuple[int, ...], slot: int) -> np.ndarray:
    """A per-thread scratch array (chunks reuse it: no allocation and page faults per chunk)."""
    n = math.prod(shape)
    return scratch(dtype, n, ("block_passes", slot), least=block_layout._CHUNK).reshape(shape)


class _Pass:
    """The blocks of one array, chunk by chunk (a chunk is a range of units of the layout).

    ``scaled(lo, hi)`` chooses the scales of the chunk's blocks (storing them in ``values``) and
    returns its elements in units of the element grid, ``x / (scale * 2**element_exponent)``,
    clamped to the element format's range (clamping before rounding is the same as saturating
    after, the bound being on the grid) and NaN in NaN blocks, with ``dec``, the per-block factors
    that scale rounded elements back. ``unscale`` multiplies by them, rounding once to the output
    dtype (exact for power-of-two scales). NVFP4's per-tensor scale needs the whole tensor's amax
    first: its block scales are computed in an earlier pass.
    """

    def __init__(
        self, data: np.ndarray, lay: _Layout, bf: BlockFormat, mode: str, tensor_scales: bool = True
    ) -> None:
        U, _, B, C = lay.dims
        self.lay, self.bf, self.dtype = lay, bf, data.dtype
        self.src = data.reshape(lay.data_shape())
        uint = np.uint32 if data.dtype == np.float32 else np.uint64
        self.bits = data.view(uint).reshape(lay.data_shape())
        self.mask = uint(np.iinfo(uint).max >> 1)
        self.C = C
        self.tail = lay.grid_view_shape()[1:]
        self.values = np.empty((U, B), dtype=np.float64)  # the block scales, NaN: NaN block
        self.directed = mode in ("up", "down", "odd")
        self.bound = float(bf.element.max)
        self.tiny = data.dtype.type(np.finfo(data.dtype).smallest_subnormal)
        self.tensor_scale = 1.0
        self.info: dict[str, Any] = {}  # NVFP4: tensor_amax, four_over_six (QuantizedBlocks)
        if bf.tensor_scale and tensor_scales:  # (the native kernels compute their own)
            s, s_dec, enc = _nvfp4_scales(_block_amax(data, lay), bf, data, lay, self.info)
            self.values[...] = s
            self.tensor_scale = s_dec
            self.enc = enc.astype(data.dtype)
        self.ts = data.dtype.type(self.tensor_scale)
        # fast path of the power-of-two rules: the exponent k from amax's exponent field
        self.P = 23 if data.dtype == np.float32 else 52
        self.BI = 127 if data.dtype == np.float32 else 1023
        self.uint = uint
        if bf.scale_rule in ("floor", "ceil"):
            ee = bf.element_exponent
            kmin = math.frexp(bf.scale.smallest_subnormal)[1] - 1
            mm, em = math.frexp(bf.element_max)  # elem_max = (2 mm) * 2**(em - 1)
            if bf.scale_rule == "floor":
                self.k_off = -self.BI - bf.element_emax
            else:
                self.k_off = -self.BI - (em - 1)
                self.m_max = uint(round((2 * mm - 1) * 2**self.P))  # elem_max's mantissa bits
            # k in [lo_k, hi_k]: within the scale format's range, and both 2**(k + ee) and
            # 2**-(k + ee) are normal numbers of the data's dtype
            self.lo_k = max(kmin, 1 - self.BI - ee)
            self.hi_k = min(bf.scale.emax, self.BI - 1 - ee)

    def _grid(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[0], *self.tail)

    def amax(self, lo: int, hi: int) -> np.ndarray:
        """Largest magnitude of each block of the chunk (float64, (h, B)); NaN for a NaN.

        Works on the magnitude bits as unsigned integers: their order is the magnitudes' order,
        and NaN's bits lie above infinity's.
        """
        m = self._amax_bits(lo, hi)
        return m.view(self.dtype).astype(np.float64).reshape(hi - lo, -1)

    def _amax_bits(self, lo: int, hi: int) -> np.ndarray:
        """Magnitude bits of each block's amax: the unsigned max of the sign-cleared bits."""
        b = self.bits[lo:hi]
        m = np.bitwise_and(b, self.mask, out=_scratch(b.dtype, b.shape, 0))
        if m.ndim == 2 and m.size:  # contiguous blocks: reduceat is far faster than max(axis=1)
            A = m.shape[1]
            return np.maximum.reduceat(m.reshape(-1), np.arange(0, m.size, A))
        if self.C > 1:
            m = m.max(axis=-1)
        return m.max(axis=1)

    def scaled(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        bf, x = self.bf, self.src[lo:hi]
        with np.errstate(all="ignore"):
            fast = bf.scale_rule in ("floor", "ceil") and self._pow2_fast(lo, hi)
            if fast:
                inv, dec = fast
                o = np.multiply(x, self._grid(inv), out=_scratch(x.dtype, x.shape, 1))
                if self.directed:  # results that underflow keep their sign and non-zero-ness
                    lost = (o == 0) & (x != 0)
                    if lost.any():
                        o[lost] = np.copysign(self.tiny, x[lost])
            elif bf.pow2_scales:
                k, nan = _pow2_exponents(self.amax(lo, hi), bf)
                self.values[lo:hi] = np.where(nan, np.nan, np.ldexp(1.0, k))
                shift = -k - bf.element_exponent
                inv = np.where(nan, np.nan, np.ldexp(1.0, shift))
                dec = np.where(nan, np.nan, np.ldexp(1.0, -shift))
                if _pow2_fits(inv, self.dtype):
                    o = x * self._grid(inv.astype(self.dtype))
                else:  # 2**133 (MX INT8 with the scale 2**-127) is not a float32
                    o = np.where(self._grid(nan), np.nan, np.ldexp(x, self._grid(shift)))
                if self.directed:  # results that underflow keep their sign and non-zero-ness
                    lost = (o == 0) & (x != 0)
                    if lost.any():
                        o[lost] = np.copysign(self.tiny, x[lost])
            elif bf.tensor_scale:  # NVFP4: x * encode factor in float32 (float64 for float64 x)
                dec = self.values[lo:hi]
                o = x * self._grid(self.enc[lo:hi])
            else:  # "amax": s = amax / elem_max rounded to the scale format; x / s in float64
                amax = self.amax(lo, hi)
                finite = np.isfinite(amax)
                sv = round_to(np.where(finite, amax, 0.0) / bf.element_max, bf.scale)
                sv = np.where(finite & np.isfinite(sv), sv, np.nan).astype(np.float64)
                self.values[lo:hi] = dec = sv
                s = self._grid(sv)
                zero = s == 0
                x64 = x.astype(np.float64)
                o = x64 / np.where(zero, 1.0, s)
                if zero.any():  # scale 0: non-zero elements saturate, zeros stay signed zeros
                    zb = np.broadcast_to(zero, o.shape)
                    o[zb] = np.where(x64 == 0, x64, np.copysign(np.inf, x64))[zb]
            if bf.scale_rule != "ceil":  # the round-up rule never exceeds the bound
                np.clip(o, -self.bound, self.bound, out=o)  # NaN stays NaN
        return o, dec

    def _pow2_fast(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(1 / (scale 2**ee), scale 2**ee) in the data's dtype, built from amax's exponent field,
        when every block of the chunk is ordinary (finite non-zero normal amax, k in range)."""
        amb = self._amax_bits(lo, hi)
        if amb.size == 0:
            return None
        P, BI = self.P, self.BI
        lo_ef, hi_ef = int(amb.min()) >> P, int(amb.max()) >> P
        ceil = self.bf.scale_rule == "ceil"
        if not (
            lo_ef >= 1
            and hi_ef < 2 * BI + 1
            and lo_ef + self.k_off >= self.lo_k
            and hi_ef + self.k_off + ceil <= self.hi_k
        ):
            return None
        sint = np.int32 if P == 23 else np.int64
        ef = amb.view(sint) >> P  # the sign bit is clear
        if ceil:
            ef += (amb & self.uint((1 << P) - 1)) > self.m_max
        shift = self.k_off + self.bf.element_exponent  # k + ee = ef + shift
        dec = ((ef + (BI + shift)) << P).view(self.dtype)
        inv = (((BI - shift) - ef) << P).view(self.dtype)
        inv, dec = inv.reshape(hi - lo, -1), dec.reshape(hi - lo, -1)
        ee = self.bf.element_exponent
        self.values[lo:hi] = np.ldexp(dec.astype(np.float64), -ee) if ee else dec
        return inv, dec

    def dec(self, lo: int, hi: int) -> np.ndarray:
        """The factors of ``unscale`` from the stored scales."""
        v = self.values[lo:hi]
        return np.ldexp(v, self.bf.element_exponent) if self.bf.element_exponent else v

    def unscale(self, q: np.ndarray, dec: np.ndarray, out: np.ndarray) -> None:
        """out = q * dec (* tensor scale): each value rounded once to out's dtype."""
        if dec.dtype != out.dtype and (not self.bf.pow2_scales or _pow2_fits(dec, out.dtype)):
            dec = dec.astype(out.dtype)
        with np.errstate(all="ignore"):
            if self.bf.tensor_scale:
                np.multiply(q * self._grid(dec), self.ts, out=out)  # q * s is exact
            else:
                np.multiply(q, self._grid(dec), out=out)
        if not self.bf.pow2_scales:  # NaN blocks are +NaN (which NaN q * NaN gives depends
            nan = self._grid(np.isnan(dec))  # on numpy's loops: x's for some shapes)
            if nan.any():
                out[np.broadcast_to(nan, out.shape)] = np.nan


class _Kernel:
    """The core's rounding of one chunk (the kernel behind :func:`~precision_lab.round_to`, used
    as :func:`~precision_lab.encode` uses it): called from the fused per-chunk pass, so the
    scaled chunk is rounded while it is in cache, and element ``i`` of the tensor gets the random
    word of flat index ``i`` under stochastic rounding, exactly as one ``round_to`` call over the
    whole scaled tensor would give it. Elements saturate (``overflow="saturate"``).
    """

    def __init__(
        self,
        elem: FloatFormat | IntFormat,
        mode: str,
        seed: int | None,
        random_bits: int | None,
        words: np.ndarray | None = None,
    ) -> None:
        self.rbits = check_random_bits(random_bits)
        self.elem, self.mode = elem, sr_mode(mode, self.rbits)
        self.key = check_seed(seed) if mode in STOCHASTIC_MODES and words is None else 0
        self.words = words  # given random words, one per element (C order): rbits= of the API

    def __call__(self, scaled: np.ndarray, start: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rounded values of the chunk ``scaled`` (C order), whose first element has flat index
        ``start``; float32 (float64 for float64 chunks), written into ``out`` if it is given
        (contiguous, of that dtype)."""
        src = np.ascontiguousarray(scaled).reshape(-1)
        wdt = working_dtype(src.dtype, self.elem)
        if out is None or out.dtype != wdt:
            out = np.empty(scaled.shape, dtype=wdt)
        res = out
        out = out.reshape(-1)
        rw: np.ndarray | None
        if self.words is not None:
            rw = self.words[start : start + src.size]
        else:
            rw = (
                _random_for(word_bits(self.mode, self.rbits), self.key, src.size, start)
                if self.mode in STOCHASTIC_MODES
                else None
            )
        with np.errstate(all="ignore"):
            if isinstance(self.elem, IntFormat):
                _round_int_chunk(self.elem, self.mode, src, out, rw)
            else:
                p = _plan(self.elem, wdt.name, self.mode, "saturate", False)
                _round_float_chunk(p, src, out, rw)
        return res.reshape(scaled.shape)


def _codes(q: np.ndarray, elem: FloatFormat | IntFormat) -> np.ndarray:
    """Codes of rounded element values (exact); NaN-block elements get code 0."""
    flat = np.where(np.isnan(q), 0.0, q).astype(q.dtype).reshape(-1)
    step = 4 * CHUNK  # pieces the core encodes in the calling thread (no nested thread pools)
    parts = [encode(flat[i : i + step], elem) for i in range(0, max(flat.size, 1), step)]
    return (parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(q.shape)


def _elements(
    x: Any,
    bf: BlockFormat,
    *,
    axis: Any,
    rounding: str,
    seed: int | None,
    random_bits: int | None,
    pad: bool,
    codes: bool | str,
    words: np.ndarray | None = None,
) -> tuple[np.ndarray, _Layout, _Pass, np.dtype]:
    """Element codes (``codes=True``) or values after scaling back, in x's shape; and the scales.
    ``codes="values"``: the rounded elements before scaling back where the native kernel runs
    (a float array), else the codes.

    One fused pass over chunks of blocks, on all cores: amax, scales, exact scaling, the core's
    rounding, scaling back, while the chunk is in cache. Stochastic rounding of a padded tensor
    (whose padded layout is not x's) scales in one pass, rounds x's whole scaled array in ONE call
    of the core, and scales back in another pass; both key the random words by x's flat index.
    ``words`` (uint64, one per element of x in C order; x needs no padding) are given random
    words that replace the seed's (the numpy passes serve them).
    """
    mode = sr_mode(check_rounding(rounding), check_random_bits(random_bits))
    data, lay = _prepare(x, bf, axis, pad)
    if words is not None and lay.needs_pad:
        raise ValueError("given random bits (rbits) need x without padding (pad=False)")
    ext = None if words is not None else _native_ext(data, lay, bf, mode)
    ps = _Pass(data, lay, bf, mode, tensor_scales=ext is None)
    kern = _Kernel(bf.element, mode, seed, random_bits, words)
    out_dtype = _out_dtype(data)
    U, A, B, C = lay.dims
    upc = _units_per_chunk(lay)
    if ext is not None:
        native = _native_blocks(ext, data, lay, ps, kern, bool(codes))
        res = (_codes(native, bf.element) if codes is True else native).reshape(lay.padded)
        return (res[lay.crop] if lay.needs_pad else res), lay, ps, out_dtype
    out = np.empty(ps.src.shape, dtype=bf.element.code_dtype if codes else out_dtype)
    if not (mode in STOCHASTIC_MODES and lay.needs_pad):

        def work(lo: int, hi: int) -> None:
            o, dec = ps.scaled(lo, hi)
            if codes:
                out[lo:hi] = _codes(kern(o, lo * A * B * C), bf.element)
            else:  # round into the output, then scale back in place, while it is in cache
                q = kern(o, lo * A * B * C, out[lo:hi])
                ps.unscale(q, dec, out[lo:hi])

        for_chunks(U, work, chunk=upc)
    else:
        scaled = np.empty(ps.src.shape, dtype=data.dtype if bf.pow2_scales else np.float64)

        def scale_work(lo: int, hi: int) -> None:
            scaled[lo:hi] = ps.scaled(lo, hi)[0]

        for_chunks(U, scale_work, chunk=upc)
        s = scaled.reshape(lay.padded)[lay.crop]  # x's own elements, in x's flat order
        q = round_to(
            s,
            bf.element,
            rounding=mode,
            overflow="saturate",
            seed=kern.key,
            random_bits=random_bits,
        )
        full = np.zeros(lay.padded, dtype=q.dtype)
        full[lay.crop] = q
        qv = full.reshape(ps.src.shape)
        if codes:
            out = _codes(qv, bf.element)
        else:

            def unscale_work(lo: int, hi: int) -> None:
                ps.unscale(qv[lo:hi], ps.dec(lo, hi), out[lo:hi])

            for_chunks(U, unscale_work, chunk=upc)
    res = out.reshape(lay.padded)
    return (res[lay.crop] if lay.needs_pad else res), lay, ps, out_dtype


_RULES = {"floor": 0, "ceil": 1, "amax": 2, "rceil": 4}


def _native_in_place(bf: BlockFormat, dtype: np.dtype, mode: str) -> bool:
    """Whether the native kernel's float32 fast path runs blocks along a leading axis in place
    (``blocks.inc``'s range32_cols: float32 data, float elements, the rules floor, ceil and rceil
    or NVFP4's): then quantizing in place beats moving the axis last and back
    (``blocks._along_last_axis``): a (512, 512) NVFP4 operand along axis 0 took 0.44 ms in
    place, 1.79 moved; MXFP8 0.37 and 1.68 (an AMD EPYC Zen 3, one thread)."""
    return (
        native_kernels.active()
        and np.dtype(dtype) == np.float32
        and isinstance(bf.element, FloatFormat)
        and not bf.element_exponent
        and mode in ROUNDING_MODES
        and (
            bf.scale_rule in ("floor", "ceil", "rceil")
            if not bf.tensor_scale
            else bf.scale_bound == float(bf.scale.max)
        )
    )


def _native_ext(data: np.ndarray, lay: _Layout, bf: BlockFormat, mode: str) -> Any:
    """The kernels extension where it serves this pass (else None): every rounding mode (the
    stochastic ones where x needs no padding: the layout's flat index is then x's), float32 and
    float64 data, float elements and MX INT8; the rules floor, ceil, rceil and amax (NVFP4 with
    the 448 bound). The other rules (nearest_even, amax_div, 4/6, another NVFP4 bound) run the
    numpy passes. (rceil ran the numpy passes until issue 34: 0.6 ms of a (512, 128) MXFP8
    operand of Transformer Engine's recipe against 0.3 for the native NVFP4 one, on this Xeon.)"""
    ext = native_kernels.ext if native_kernels.active() else None
    elem = bf.element
    if (
        ext is None
        or mode not in ROUNDING_MODES  # (rounding.CORE_ONLY_MODES: no header mode number)
        or (mode in STOCHASTIC_MODES and lay.needs_pad)
        or data.dtype not in (np.dtype(np.float32), np.dtype(np.float64))
        or data.size == 0
        or (isinstance(elem, IntFormat) and elem.bits != 8)
        or bf.scale_rule not in _RULES
        or (bf.tensor_scale and bf.scale_bound != float(bf.scale.max))
    ):
        return None
    return ext


def _native_blocks(
    ext: Any, data: np.ndarray, lay: _Layout, ps: _Pass, kern: _Kernel, codes: bool
) -> np.ndarray:
    """The fused pass on the native kernels (the same values as the numpy passes).

    The kernel follows :meth:`_Pass.scaled`, :class:`_Kernel` and :meth:`_Pass.unscale`
    operation by operation (``precision_lab/native/blocks.inc``), and for NVFP4
    :func:`_nvfp4_scales` block by block, after a first pass for the per-tensor amax. With
    ``codes`` it returns the rounded elements (before scaling back), which :func:`_codes` encodes.
    Stochastic rounding draws the random word of each element's flat index, as :class:`_Kernel`.
    """
    bf, mode = ps.bf, kern.mode
    elem = bf.element
    is_int = isinstance(elem, IntFormat)
    sf = bf.scale
    dims = np.array(lay.dims, dtype=np.int64)
    upc = _units_per_chunk(lay)
    mult = 0.0
    if bf.tensor_scale:  # NVFP4: the per-tensor amax first (blocks without NaN or infinity)
        big: list[float] = []
        for_chunks(lay.dims[0], lambda lo, hi: big.append(ext.block_amax(data, dims, None, lo, hi)),
                   chunk=upc)  # fmt: skip
        s_dec, m32 = _nvfp4_tensor_scale(np.float32(max(big)), bf)
        ps.tensor_scale, mult = float(s_dec), float(m32)
        ps.info["tensor_amax"] = float(np.float32(max(big)))
    mm, em = math.frexp(bf.element_max)
    kmin = math.frexp(sf.smallest_subnormal)[1] - 1
    ints = np.array([kmin, sf.emax, bf.element_emax, bf.element_exponent, em], dtype=np.int32)
    dbls = np.array([mm, float(elem.max), bf.element_max, ps.tensor_scale, mult], dtype=np.float64)
    efmt = np.array(format_args(sf if is_int else elem), dtype=np.int32)  # type: ignore[arg-type]
    sfmt = np.array(format_args(sf), dtype=np.int32)
    rule = 3 if bf.tensor_scale else _RULES[bf.scale_rule]
    if bf.scale_rule == "rceil":  # the kernel's quotient factor: fp32(1 / elem_max)
        dbls[4] = float(round_to(np.float64(1.0 / bf.element_max), "fp32"))
    out = np.empty(lay.padded, dtype=data.dtype)
    m = ROUNDING_MODES.index(mode)
    key = None
    if mode in STOCHASTIC_MODES:
        rb = word_bits(mode, kern.rbits)
        key = np.array([kern.key & (2**64 - 1), kern.key >> 64, rb], dtype=np.uint64)

    def work(lo: int, hi: int) -> None:
        ext.blocks(data, out, dims, rule, m, codes, is_int, 8, efmt, sfmt, ints, dbls,
                   ps.values, key, lo, hi)  # fmt: skip

    for_chunks(lay.dims[0], work, chunk=upc)
    res = out.reshape(ps.src.shape)
    if bf.scale_rule in ("floor", "ceil", "rceil") and not codes:
        _positive_nan_blocks(res, ps, lay, bf, data.dtype)
    return res


def _positive_nan_blocks(
    res: np.ndarray, ps: _Pass, lay: _Layout, bf: BlockFormat, dtype: np.dtype
) -> None:
    """NaN blocks of the chunks where :meth:`_Pass.scaled` takes its ``ldexp`` branch (a block
    factor ``2**-(k + ee)`` that is no value of ``dtype``) come out as +NaN there, not as
    ``x * NaN`` (whose sign is x's when x is a NaN): the same here."""
    nan = np.isnan(ps.values)
    if not nan.any():
        return
    info = np.finfo(dtype)
    k = np.frexp(np.where(nan, 1.0, ps.values))[1] - 1
    shift = -k - bf.element_exponent
    lo_sh = int(np.log2(info.smallest_subnormal))
    bad = ~nan & ((shift < lo_sh) | (shift > info.maxexp - 1))
    upc = _units_per_chunk(lay)
    for lo in range(0, lay.dims[0], upc):
        hi = min(lo + upc, lay.dims[0])
        if bad[lo:hi].any() and nan[lo:hi].any():
            blk = ps._grid(nan[lo:hi])
            chunk = res[lo:hi]
            chunk[np.broadcast_to(blk, chunk.shape)] = np.nan


def _out_dtype(data: np.ndarray) -> np.dtype:
    return np.dtype(np.float64) if data.dtype == np.float64 else np.dtype(np.float32)
