"""torchao's MX quantizer (``torchao.prototype.mx_formats.mx_tensor.to_mx``, torchao 0.18, run on
the CPU) against ``quantize_blocks`` with the matching scale rule, bit for bit on the element codes
and the E8M0 scale codes:

==================  ==================
torchao             precision_lab
==================  ==================
``FLOOR``           ``"floor"``
``CEIL``            ``"ceil_emax"``
``EVEN``            ``"nearest_even"``
``RCEIL``           ``"rceil"``
==================  ==================

over float32 inputs of several classes: normal blocks of wide range, amax at and next to every
scale boundary, element-grid ties, huge amax (near FLT_MAX), zeros, and (FP8) blocks with an
infinity or NaN. torchao's code departs from the rules it names in four places, which
:func:`torchao_codes` models and this test pins down exactly (precision_lab follows the OCP MX
spec and its scale rules there):

* **scale 2**-127 (E8M0 code 0)**: torchao divides by ``max(scale, 2**-126)`` (FLOOR, CEIL, EVEN;
  float32 2**-127 is subnormal) and multiplies by 1.0 instead of ``2**127`` (RCEIL), so a block
  with a tiny non-zero amax gets elements twice (RCEIL: ``2**-127`` times) what its scale says;
* **a block with an infinity** is an ordinary block to torchao: scale ``2**(128 - emax_elem)``
  (FLOOR/CEIL/EVEN; the exponent field of inf) or code 0xFE (RCEIL, elements times 2**-127), the
  infinity clamped to the element maximum; precision_lab (OCP: a block holding an infinity is
  NaN) gives the NaN scale 0xFF and element codes 0;
* **a NaN block** gets scale 0xFF from both; torchao's element codes are those of ``x / inf``
  (FLOOR/CEIL/EVEN: signed zeros, and NaN for the NaN) or NaN (RCEIL), precision_lab's are 0
  (the OCP spec leaves them free: every value of the block decodes to NaN either way).

* **RCEIL in eager mode** (the CPU fallback; torchao's compiled Blackwell path uses
  ``cvt.rp.satfinite.ue8m0x2.f32``) computes ``ceil(torch.log2(d))`` with ``d = fp32(amax /
  elem_max)`` in float32: for a ``d`` a few ulps above a power of two the float32 log2 rounds onto
  the integer, so the scale is one power of two lower than the rule (and cuBLAS, and
  precision_lab's ``"rceil"``) gives, and the block's amax clips.

torchao's FP4/FP6 casts define no NaN or infinity: those classes run for FP8 only.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.quant.block_formats import get_block_format

torch = pytest.importorskip("torch", reason="torchao's MX code needs torch (the [test] extra)")
mx = pytest.importorskip(
    "torchao.prototype.mx_formats.mx_tensor", reason="torchao 0.18 (the [test] extra) is missing"
)
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402

RULES = {"floor": "FLOOR", "ceil_emax": "CEIL", "nearest_even": "EVEN", "rceil": "RCEIL"}
FORMATS = {
    "mxfp8_e4m3": torch.float8_e4m3fn,
    "mxfp8_e5m2": torch.float8_e5m2,
    "mxfp4_e2m1": torch.float4_e2m1fn_x2,
}
F32 = np.float32


def torchao_mx(x: np.ndarray, name: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """(element codes one per input, scale codes) from torchao's ``to_mx``."""
    mode = getattr(ScaleCalculationMode, RULES[rule])
    scale, data = mx.to_mx(torch.from_numpy(x.copy()), FORMATS[name], 32, mode)
    sc = scale.view(torch.uint8).numpy().reshape(x.shape[0], -1)
    d = data.view(torch.uint8).numpy()
    if name == "mxfp4_e2m1":  # packed two per byte, even index in the low nibble
        d = np.stack([d & 0x0F, d >> 4], axis=-1).reshape(x.shape)
    return d.reshape(x.shape), sc


def _rceil_log2_k(amax: float, elem_max: float) -> int:
    """torchao's eager RCEIL exponent: ``ceil(log2(d))`` with ``d = fp32(amax / elem_max)`` (a
    division, not cuBLAS's product with fp32(1 / elem_max)) and log2 in float32, which rounds the
    log2 of a d just above a power of two onto the integer (modelled as the float32 rounding of
    the float64 log2)."""
    d = F32(amax) / F32(elem_max)
    if d == 0:
        return -127
    return int(min(max(math.ceil(F32(math.log2(float(d)))), -127), 127))


def torchao_codes(x: np.ndarray, name: str, rule: str) -> tuple[np.ndarray, np.ndarray, int]:
    """What torchao gives, predicted from precision_lab: quantize_blocks with the matching rule,
    and the departures of the module docstring block by block; also how many blocks depart."""
    bf = get_block_format(name, scale_rule=rule)
    q = pl.quantize_blocks(x, bf)
    codes, sc = q.element_codes().copy(), q.scale_codes.copy()
    blocks = x.reshape(x.shape[0], -1, 32)
    cb = codes.reshape(blocks.shape)
    emax = bf.element_emax
    departed = 0
    for r, b in np.ndindex(blocks.shape[:2]):
        blk = blocks[r, b].astype(np.float64)
        finite = np.isfinite(blk).all()
        k_rc = _rceil_log2_k(float(np.abs(blk).max()), bf.element_max) if finite else 0
        if rule == "rceil" and finite and k_rc != int(sc[r, b]) - 127 and k_rc != -127:
            sc[r, b] = k_rc + 127  # float32 log2 rounded onto an integer: one scale lower
            factor = 2.0**-k_rc
        elif np.isnan(blk).any():
            factor = math.nan if rule == "rceil" else 0.0  # x / inf
            sc[r, b] = 0xFF
        elif np.isinf(blk).any():
            k = None if rule == "rceil" else 128 - emax
            sc[r, b] = 0xFE if rule == "rceil" else k + 127
            factor = 2.0**-127 if rule == "rceil" else 2.0**-k
        elif sc[r, b] == 0 and (blk != 0).any():
            factor = 1.0 if rule == "rceil" else 2.0**126
        else:
            continue
        departed += 1
        with np.errstate(invalid="ignore"):
            v = np.where(np.isnan(blk), blk, blk * factor)  # exact; a NaN keeps its sign
            v = np.clip(v, -bf.element_max, bf.element_max)
        cb[r, b] = pl.encode(v, bf.element, overflow="saturate")
    return codes, sc, departed


def _blocks(rng: np.random.Generator, name: str, kind: str) -> np.ndarray:
    bf = get_block_format(name)
    emax, em = bf.element_emax, bf.element_max
    mb = bf.element.mantissa_bits
    if kind == "normal":
        x = rng.standard_normal((48, 32)) * 2.0 ** rng.integers(-40, 40, (48, 1))
    elif kind == "boundaries":  # amax at and next to the rules' boundaries
        amaxes = []
        for k in (-3, 0, 7):
            for base in (1.0, em / 2**emax, 2.0 - 2.0 ** -(mb + 1), 1.5):
                a = F32(base * 2.0**k)
                for step in range(-2, 3):
                    v = a
                    for _ in range(abs(step)):
                        v = np.nextafter(v, F32(np.inf) if step > 0 else F32(0))
                    amaxes.append(float(v))
        x = rng.uniform(-1, 1, (len(amaxes), 32)) * np.array(amaxes)[:, None]
        x[:, 5] = amaxes
    elif kind == "ties":  # midpoints of the element grid, the block amax the element maximum
        vals = np.array([v for v in bf.element.values() if v >= 0])
        mids = (vals[:-1] + vals[1:]) / 2
        x = rng.choice(mids, (24, 32)) * rng.choice([-1.0, 1.0], (24, 32))
        x[:, 0] = em
        x *= 2.0 ** rng.integers(-5, 5, (24, 1))
    elif kind == "huge":  # amax up to FLT_MAX
        x = rng.uniform(-1, 1, (16, 32)) * np.finfo(np.float32).max
        x[:8, 1] = np.finfo(np.float32).max
    elif kind == "tiny":  # E8M0 code 0 (and float32 subnormals)
        x = rng.uniform(-1, 1, (24, 32)) * 2.0 ** rng.integers(-149, -110, (24, 1))
    elif kind == "zeros":
        x = np.zeros((4, 32))
        x[1] = -0.0
        x[2, ::2] = -0.0
        x[3, 7] = 1.0
    elif kind == "specials":
        x = rng.standard_normal((8, 32))
        x[0, 3], x[1, 0], x[2, 31] = np.inf, -np.inf, np.nan
        x[3, 3], x[3, 4] = np.inf, np.nan
        x[4, :] = np.inf
        x[5, 9] = -np.nan
    else:
        raise AssertionError(kind)
    return x.astype(np.float32)


KINDS = ["normal", "boundaries", "ties", "huge", "tiny", "zeros", "specials"]


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", list(FORMATS))
def test_quantize_blocks_matches_torchao_to_mx(name: str, rule: str) -> None:
    rng = np.random.default_rng(len(name) * 7 + len(rule))
    for kind in KINDS:
        if kind == "specials" and name == "mxfp4_e2m1":
            continue  # torchao's FP4 cast defines no NaN or infinity
        x = _blocks(rng, name, kind)
        got_c, got_s = torchao_mx(x, name, rule)
        want_c, want_s, departed = torchao_codes(x, name, rule)
        msg = f"{name} {rule} {kind}"
        np.testing.assert_array_equal(got_s, want_s, err_msg=f"{msg}: scales")
        # NaN elements: both NaN, of the same sign (E5M2 has three NaN codes: torch's is 0x7F,
        # precision_lab's canonical one 0x7E)
        elem = get_block_format(name).element
        gv, wv = pl.decode(got_c, elem), pl.decode(want_c, elem)
        nan = np.isnan(wv)
        np.testing.assert_array_equal(np.isnan(gv), nan, err_msg=f"{msg}: NaN elements")
        if rule != "rceil":  # RCEIL: x * NaN, whose sign is the CPU's choice of NaN operand
            np.testing.assert_array_equal(np.signbit(gv[nan]), np.signbit(wv[nan]), err_msg=msg)
        np.testing.assert_array_equal(got_c[~nan], want_c[~nan], err_msg=f"{msg}: elements")
        exact = kind in ("normal", "ties", "huge", "zeros", "boundaries")
        if exact and not (kind == "boundaries" and rule == "rceil"):
            assert departed == 0, msg  # no departure: torchao == quantize_blocks, bit for bit


def test_the_departures_are_real() -> None:
    """Each documented departure occurs (so the model above is not vacuous): a tiny block, an
    infinity, a NaN."""
    x = np.zeros((3, 32), dtype=np.float32)
    x[0, 0] = 2.0**-126  # floor: scale 2**-127 (clamped); torchao divides by 2**-126
    x[1, 0], x[1, 1] = np.inf, 1.0
    x[2, 0], x[2, 1] = np.nan, -1.0
    got_c, got_s = torchao_mx(x, "mxfp8_e4m3", "floor")
    q = pl.quantize_blocks(x, "mxfp8_e4m3")
    assert q.scale_codes.ravel().tolist() == [0, 255, 255]
    assert got_s.ravel().tolist() == [0, 128 - 8 + 127, 255]
    assert pl.decode(q.element_codes()[0, :1], "e4m3")[0] == 2.0  # 2**-126 / 2**-127
    assert pl.decode(got_c[0, :1], "e4m3")[0] == 1.0
    assert got_c[1, 0] == 0x7E and q.element_codes()[1].tolist() == [0] * 32  # inf -> 448
    assert got_c[2, 1] == 0x80 and np.isnan(pl.decode(got_c[2, :1], "e4m3")[0])


def test_torchao_eager_rceil_rounds_log2_onto_the_integer() -> None:
    """amax = 1.75 * 2**-3 (1 + 2**-23): d = amax / 448 is one ulp above 2**-11; the rule (and
    precision_lab) gives scale 2**-10, torchao's float32 log2 (-11 + 1.7e-7 -> -11) 2**-11."""
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 0] = np.nextafter(F32(1.75 * 2**-3), F32(1))
    q = pl.quantize_blocks(x, get_block_format("mxfp8_e4m3", scale_rule="rceil"))
    got_c, got_s = torchao_mx(x, "mxfp8_e4m3", "rceil")
    assert q.scale_codes.ravel().tolist() == [127 - 10] and got_s.ravel().tolist() == [127 - 11]
    assert pl.decode(got_c[0, :1], "e4m3")[0] == 448.0  # the amax clips


def test_ceil_emax_differs_from_ceil() -> None:
    """torchao's CEIL (``ceil_emax``) is not TE/cuBLAS's round-up rule (``ceil``): amax 384 in
    MXFP8 E4M3 gets scale 2 (2**(ceil(log2 384) - 8)), where ``ceil`` keeps 1 (384 <= 448)."""
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 0] = 384.0
    ce = pl.quantize_blocks(x, get_block_format("mxfp8_e4m3", scale_rule="ceil_emax"))
    up = pl.quantize_blocks(x, get_block_format("mxfp8_e4m3", scale_rule="ceil"))
    assert ce.scales.ravel().tolist() == [2.0] and up.scales.ravel().tolist() == [1.0]
    _, sc = torchao_mx(x, "mxfp8_e4m3", "ceil_emax")
    assert sc.ravel().tolist() == [128]
