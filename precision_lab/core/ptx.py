"""Replay of the PTX stochastic-rounding conversions ``cvt.rs`` from the kernel's own random bits.

``cvt.rs.satfinite.e2m1x4.f32 d, {a, b, e, f}, rbits`` (and ``.e4m3x4`` / ``.e5m2x4``, and
``cvt.rs{.satfinite}.bf16x2.f32`` / ``.f16x2.f32 d, a, b, rbits``) round float32 inputs
stochastically with random bits the kernel supplies in one 32-bit register per instruction.
:func:`cvt_rs` takes those registers and gives the kernel's results, element by element, so a
GPU kernel's output can be reproduced (and checked) on the CPU.

What the PTX ISA (9.0, ``cvt``, "rbits ... used for providing random bits for .rs rounding
mode") states, and what it leaves open (each choice below is a documented assumption, and the
constant :data:`LAYOUTS` spells the bit positions out):

* Which bits each operand gets. ``.f16x2``: the 13 low bits of ``rbits[31:16]`` for ``a`` and of
  ``rbits[15:0]`` for ``b`` (the 3 high bits of each half "are 0": :func:`cvt_rs` ignores them
  whatever they hold). ``.bf16x2``: ``rbits[31:16]`` for ``a``, ``rbits[15:0]`` for ``b``.
  ``.e4m3x4``/``.e5m2x4``: "lower 16-bits are used for operands e, f and upper 16 bits are used
  for operands a, b" -- read literally: ``a`` and ``b`` both round with ``rbits[31:16]``, ``e``
  and ``f`` both with ``rbits[15:0]`` (**open**: the text could also mean 8 bits each; it gives no
  byte split, unlike the e2m1 sentence). ``.e2m1x4``: "lower 8-bits from both 16-bits half ...
  for operands e, f and upper 8-bits from both 16-bits half ... for operands a, b" -- **open**:
  which upper byte is ``a``'s; :func:`cvt_rs` gives ``a`` the upper half's (``rbits[31:24]``),
  ``b`` the lower half's (``rbits[15:8]``), ``e`` ``rbits[23:16]`` and ``f`` ``rbits[7:0]``,
  the order in which the results are packed (``a`` in the high bits).
* How the N random bits round (**open**: the ISA names the mode "stochastic rounding" and gives
  no formula). Assumed: add-and-truncate on the magnitude, aligned just below the result's last
  kept bit -- away from zero iff ``frac + r * 2**-N >= 1`` with ``frac`` the exact discarded
  fraction in units of the result's quantum and ``r`` the operand's N-bit field as an unsigned
  integer: precision_lab's ``stochastic`` rounding (Fitzgibbon & Felix's SRFF) with
  ``random_bits = N``. For fp16 and bf16 from float32 N equals the dropped bits in the normal
  range (13, 16), so the rounding is exact SR there; for e4m3/e5m2 (20/21 dropped bits, N = 16)
  and e2m1 (22, N = 8) its bias is ``-2**-(N+1)`` of a quantum for uniform fractions. Results
  in the subnormal range keep the same alignment (relative to their quantum), as the core does.
* ``.satfinite`` (mandatory for the 8- and 4-bit types, optional for fp16/bf16): finite results
  beyond the largest finite value, and infinities, become ``±max``; NaN stays NaN where the
  format has one. e2m1 has no NaN and the ISA does not say what a NaN input gives: **open**,
  :func:`cvt_rs` raises ValueError for NaN inputs to e2m1. Without ``.satfinite`` (fp16/bf16)
  overflow follows IEEE 754 for a round-to-nearest-like mode: ``±inf``.
* ``.relu`` (optional): negative results and ``-0`` become ``+0``; NaN stays NaN.

Inputs are the instruction's ``.f32`` operands: float32 arrays, or float64 arrays whose values
are all float32 (anything else would need a rounding the instruction never does: ValueError).

>>> import numpy as np
>>> x = np.array([1.25, 1.25, 1.25, 1.25], dtype=np.float32)   # halfway between 1 and 1.5
>>> cvt_rs(x, "e2m1", np.uint32(0x80_7F_00_FF), output="values")  # bytes a=80 e=7F b=00 f=FF
array([1.5, 1. , 1. , 1.5], dtype=float32)
>>> hex(int(cvt_rs(x, "e2m1", np.uint32(0x80_7F_00_FF), output="packed")[0]))
'0x3223'
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .codec import decode, encode
from .formats import FloatFormat, get_format
from .rounding import _plan, _round_float_chunk, as_float_array

__all__ = ["CVT_RS_FORMATS", "LAYOUTS", "cvt_rs", "cvt_rs_bits"]

#: the destination formats of ``cvt.rs`` that :func:`cvt_rs` replays (PTX type -> format name)
CVT_RS_FORMATS = {"e2m1x4": "e2m1", "e4m3x4": "e4m3", "e5m2x4": "e5m2", "bf16x2": "bf16",
                  "f16x2": "fp16"}  # fmt: skip

#: per format: (operands per instruction, random bits per operand N, and for each operand in
#: order a, b[, e, f] the shift of its field in ``rbits``: the operand's random integer is
#: ``(rbits >> shift) & (2**N - 1)``)
LAYOUTS: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "e2m1": (4, 8, (24, 8, 16, 0)),
    "e4m3": (4, 16, (16, 16, 0, 0)),
    "e5m2": (4, 16, (16, 16, 0, 0)),
    "bf16": (2, 16, (16, 0)),
    "fp16": (2, 13, (16, 0)),
}


def _format_name(fmt: str | FloatFormat) -> str:
    if isinstance(fmt, str) and fmt.strip().lower() in CVT_RS_FORMATS:
        return CVT_RS_FORMATS[fmt.strip().lower()]
    try:
        f = get_format(fmt)
    except ValueError:
        f = None
    for name in LAYOUTS:
        if get_format(name) == f:
            return name
    raise ValueError(
        f"fmt must be a cvt.rs destination type ({', '.join(CVT_RS_FORMATS)}, or the formats "
        f"{', '.join(LAYOUTS)}), got {fmt!r}"
    )


def cvt_rs_bits(rbits: Any, fmt: str | FloatFormat) -> np.ndarray:
    """The random integer of each operand: ``rbits`` (uint32, one per instruction, shape
    ``(..., G)``) -> uint32 of shape ``(..., G * k)``, k operands per instruction (:data:`LAYOUTS`).

    >>> cvt_rs_bits(np.array([0x1234_ABCD], dtype=np.uint32), "bf16").tolist()
    [4660, 43981]
    >>> [hex(v) for v in cvt_rs_bits(np.uint32(0xFFFF_FFFF), "f16x2")]
    ['0x1fff', '0x1fff']
    """
    name = _format_name(fmt)
    k, nbits, shifts = LAYOUTS[name]
    r = np.asarray(rbits)
    if r.dtype.kind not in "ui" or (r.size and (r.min() < 0 or r.max() > 0xFFFFFFFF)):
        raise TypeError(f"rbits must hold unsigned 32-bit words (uint32), got {r.dtype} {r!r:.60}")
    r = r.astype(np.uint32)
    sh = np.array(shifts, dtype=np.uint32)
    fields = (r[..., None] >> sh) & np.uint32((1 << nbits) - 1)
    return fields.reshape(*r.shape[:-1], r.shape[-1] * k) if r.ndim else fields.reshape(k)


def cvt_rs(
    x: Any,
    fmt: str | FloatFormat,
    rbits: Any,
    *,
    satfinite: bool = True,
    relu: bool = False,
    output: str = "codes",
) -> np.ndarray:
    """The results of ``cvt.rs{.relu}{.satfinite}.<fmt>.f32`` on ``x`` with the random registers
    ``rbits`` (see the module docstring for what the ISA states and the choices it leaves open).

    Parameters
    ----------
    x:
        float32 operands, shape ``(..., G * k)``: the last axis holds the instructions' operands in
        order (``a, b`` for bf16x2/f16x2, ``a, b, e, f`` for the x4 types), k per instruction.
    fmt:
        ``"e2m1x4"``, ``"e4m3x4"``, ``"e5m2x4"``, ``"bf16x2"``, ``"f16x2"`` or the element format
        (``"e2m1"``, ``"e4m3"``, ``"e5m2"``, ``"bf16"``, ``"fp16"``).
    rbits:
        uint32 random registers, shape ``(..., G)`` (or broadcastable to it): one per
        instruction.
    satfinite, relu:
        The instruction's modifiers (``.satfinite`` is mandatory for e2m1/e4m3/e5m2).
    output:
        ``"codes"`` (default: one code per element, uint8 or uint16, x's shape), ``"values"``
        (the results as float32) or ``"packed"`` (the destination registers ``d``, shape
        ``(..., G)``: uint16 for e2m1x4, uint32 otherwise, ``a`` in the high bits).

    Examples
    --------
    >>> x = np.array([1.0 + 2**-11, 1.0 + 2**-11], dtype=np.float32)  # 1/16 of a bf16 quantum
    >>> cvt_rs(x, "bf16x2", np.uint32(0xF000_EFFF), output="values")  # up iff r >= 0xF000
    array([1.0078125, 1.       ], dtype=float32)
    """
    name = _format_name(fmt)
    f = get_format(name)
    assert isinstance(f, FloatFormat)
    k, nbits, _ = LAYOUTS[name]
    if output not in ("codes", "values", "packed"):
        raise ValueError(f"output must be 'codes', 'values' or 'packed', got {output!r}")
    if not satfinite and name not in ("bf16", "fp16"):
        raise ValueError(f"cvt.rs to {name} requires .satfinite (satfinite=False given)")
    a = as_float_array(x)
    if a.dtype != np.float32:
        a32 = a.astype(np.float32)
        same = (a32.astype(a.dtype) == a) | (np.isnan(a) & np.isnan(a32))
        if not same.all():
            raise ValueError("x must hold float32 values (cvt.rs takes .f32 operands)")
        a = a32
    if a.ndim == 0 or a.shape[-1] % k:
        raise ValueError(
            f"x's last axis must hold whole instructions: a multiple of {k} operands for "
            f"{name}, got shape {a.shape}"
        )
    want = (*a.shape[:-1], a.shape[-1] // k)
    try:
        r = np.broadcast_to(np.asarray(rbits), want)
    except ValueError:
        raise ValueError(
            f"rbits must have shape {want} (one uint32 per instruction of {k} operands) or "
            f"broadcast to it, got {np.shape(rbits)}"
        ) from None
    if name == "e2m1" and np.isnan(a).any():
        raise ValueError(
            "x contains NaN: the PTX ISA does not say what cvt.rs gives for NaN in e2m1"
        )
    n_op = cvt_rs_bits(r, name).reshape(-1).astype(np.uint64)
    words = n_op << np.uint64(64 - nbits)  # the operand's N bits at the top of the random word
    src = np.ascontiguousarray(a).reshape(-1)
    out = np.empty(src.size, dtype=np.float32)
    p = _plan(f, "float32", "stochastic", "saturate" if satfinite else "ieee", False)
    with np.errstate(all="ignore"):
        _round_float_chunk(p, src, out, words)
    if relu:
        out[(out < 0) | ((out == 0) & np.signbit(out))] = 0.0
    vals = out.reshape(a.shape)
    if output == "values":
        return vals
    codes = encode(vals, f, rounding="toward_zero")  # on the grid: exact
    if output == "codes":
        return codes
    bits = f.bits
    c = codes.astype(np.uint32).reshape(*a.shape[:-1], a.shape[-1] // k, k)
    sh = np.array([bits * (k - 1 - i) for i in range(k)], dtype=np.uint32)
    packed = np.bitwise_or.reduce(c << sh, axis=-1)
    return packed.astype(np.uint16 if name == "e2m1" else np.uint32)


def _decode_packed(d: Any, fmt: str | FloatFormat) -> np.ndarray:
    """Values of packed registers ``d`` (the inverse of ``output="packed"``), for tests."""
    name = _format_name(fmt)
    f = get_format(name)
    k = LAYOUTS[name][0]
    bits = f.bits
    d = np.asarray(d).astype(np.uint32)
    sh = np.array([bits * (k - 1 - i) for i in range(k)], dtype=np.uint32)
    codes = (d[..., None] >> sh) & np.uint32((1 << bits) - 1)
    return decode(codes.reshape(*d.shape[:-1], d.shape[-1] * k).astype(f.code_dtype), f)
