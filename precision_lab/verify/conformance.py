"""Conformance of block quantizers (NVFP4, MXFP4, MXFP8): shipped vectors and a checker.

A *vector* is a small npz file of ``inputs`` (float32, rows x columns, blocks along the last
axis), the ``codes`` precision_lab gives them (one element code per input, uint8, unpacked), the
``scale_codes`` of the blocks (uint8: E8M0 for MX, E4M3 for NVFP4), the NVFP4 ``tensor_scale``
(S_dec, float32; 1 for MX) and what produced them: ``format``, ``scale_rule``, ``rounding``, and
for stochastic rounding ``seed``, ``random_bits`` and the ``random_words`` used (uint64, element
``i`` in C order uses word ``i``; its top ``random_bits`` bits are the ones that count), and
``hadamard`` (0: none). The vectors ship in ``precision_lab/data/conformance/``
(:func:`vector_paths`); ``python -m precision_lab.verify.conformance`` regenerates them from
fixed seeds (:func:`write_vectors`), and the test suite checks that the shipped files are what it
writes.

:func:`check_conformance` compares a third-party quantizer's codes and scales with precision_lab's
for the same inputs, block by block, and names the likely cause of each difference:

* ``scale rule``: the block's scale is the one another rule of :data:`SCALE_RULES` gives (e.g.
  ``floor`` where ``ceil``/RCEIL was expected), or off by a power of two, or none known;
* ``saturation``: an element beyond the element format's largest value was not clamped (an inf or
  NaN code, or a value above ``max``);
* ``tie rule``: the elements are those of ``nearest_away`` (ties away from zero) or
  ``nearest_zero``; ``rounding``: those of another mode (``toward_zero`` ...);
* ``element rounding``: none of those.

:func:`load_vector` reads the npz files and CSV files of one element per line
(``input,code,scale_code``, blocks consecutive; ``# key=value`` header lines name the format and
rule). The command line is ``precision-lab conform FILE``.

>>> import numpy as np
>>> x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
>>> q = quantize_blocks(x, "mxfp4_e2m1")
>>> check_conformance(x, q.element_codes(), q.scale_codes, "mxfp4_e2m1").ok
True
"""

from __future__ import annotations

import csv
import importlib
import io
import math
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.codec import decode
from ..core.formats import IntFormat
from ..core.random_words import random_words
from ..core.rounding import check_rounding, is_stochastic
from ..quant import block_formats
from ..quant.block_formats import SCALE_RULES, BlockFormat, get_block_format
from ..quant.blocks import quantize_blocks

__all__ = [
    "CONFORMANCE_DIR",
    "ConformanceCase",
    "ConformanceReport",
    "check_conformance",
    "load_vector",
    "make_vector",
    "vector_cases",
    "vector_paths",
    "write_vectors",
]

#: where the shipped vectors live (package data)
CONFORMANCE_DIR = Path(__file__).resolve().parent.parent / "data" / "conformance"

#: the block formats of the vectors
VECTOR_FORMATS = ("nvfp4", "mxfp4_e2m1", "mxfp8_e4m3", "mxfp8_e5m2")
#: element rounding modes of the vectors (stochastic with 8 random bits, seed 21)
VECTOR_MODES = ("nearest_even", "nearest_away", "toward_zero", "stochastic")
_SR_SEED, _SR_BITS = 21, 8
_SHAPE = (16, 128)
#: seed of the random sign vector of the rotated vectors, and the rotation size per format
_HADAMARD_SEED = 7
_HADAMARD_SIZES = {"nvfp4": 16, "mxfp4_e2m1": 32, "mxfp8_e4m3": 32}


def _hadamard_fn() -> Any:
    """``precision_lab.quant.hadamard.hadamard``, or None in a build without it."""
    try:
        return importlib.import_module("..quant.hadamard", __package__).hadamard
    except (ImportError, AttributeError):
        return None


def rotate(x: np.ndarray, size: int, seed: int | None = _HADAMARD_SEED) -> np.ndarray:
    """The random Hadamard rotation of the rotated vectors: blocks of ``size`` along the last
    axis, sign vector from ``seed``, exact arithmetic (``pl.hadamard``)."""
    fn = _hadamard_fn()
    if fn is None:
        raise ValueError("this vector uses a Hadamard rotation, which this build lacks")
    return np.asarray(fn(x, block=size, seed=seed))


def _rules_for(bf: BlockFormat) -> list[str]:
    """The scale rules of :data:`SCALE_RULES` that apply to a block format: the power-of-two
    rules (``block_formats.POW2_RULES`` where it exists) for E8M0 scales (MX), the others for
    NVFP4 (``block_formats.TENSOR_RULES``) and the FP32-scaled tiles; each one a valid
    ``get_block_format(bf, scale_rule=rule)``.

    >>> _rules_for(get_block_format("mxfp4_e2m1"))[:2], _rules_for(get_block_format("nvfp4"))[0]
    (['floor', 'ceil'], 'amax')
    """
    pow2_rules = tuple(getattr(block_formats, "POW2_RULES", ("floor", "ceil")))
    tensor_rules = tuple(getattr(block_formats, "TENSOR_RULES", ("amax",)))
    pow2 = bf.scale.exponent_bits > 0 and bf.scale.mantissa_bits == 0  # E8M0 scales
    out = []
    for rule in SCALE_RULES:
        if pow2 != (rule in pow2_rules) or (bf.tensor_scale and rule not in tensor_rules):
            continue
        try:
            get_block_format(bf, scale_rule=rule)
        except (ValueError, TypeError):
            continue
        out.append(rule)
    return out


def vector_cases() -> list[dict[str, Any]]:
    """Every (format, scale rule, rounding) the shipped vectors cover.

    >>> [c for c in vector_cases() if c["format"] == "nvfp4"][0]
    {'format': 'nvfp4', 'scale_rule': 'amax', 'rounding': 'nearest_even', 'hadamard': 0}
    """
    cases = []
    for name in VECTOR_FORMATS:
        bf = get_block_format(name)
        for rule in _rules_for(bf):
            for mode in VECTOR_MODES:
                cases.append({"format": name, "scale_rule": rule, "rounding": mode, "hadamard": 0})
    if _hadamard_fn() is not None:  # rotated inputs: the formats' default rules, RN and SR
        for name, size in _HADAMARD_SIZES.items():
            rule = get_block_format(name).scale_rule
            for mode in ("nearest_even", "stochastic"):
                cases.append(
                    {"format": name, "scale_rule": rule, "rounding": mode, "hadamard": size}
                )
    return cases


def _inputs(bf: BlockFormat, seed: int) -> np.ndarray:
    """Inputs that exercise the rules: N(0,1) blocks, wide dynamic range, amax just above and
    below powers of two (where floor clips and ceil does not), exact ties of the element grid
    after scaling, tiny (subnormal) elements, zeros, and a block of one large value."""
    cols = _SHAPE[1]
    bs = bf.block_size
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(_SHAPE)
    x[1] *= 2.0 ** rng.integers(-12, 12, cols)  # wide dynamic range
    elem = np.array([v for v in bf.element.values() if np.isfinite(v) and v >= 0])
    for b in range(cols // bs):  # row 2: amax just above a power of two (floor clips)
        blk = slice(b * bs, (b + 1) * bs)
        x[2, blk] = rng.uniform(-1, 1, bs) * 2.0 ** (b % 5)
        x[2, b * bs] = 2.0 ** (b % 5) * (bf.element_max / 2**bf.element_emax) * 1.03
        x[3, blk] = rng.uniform(-1, 1, bs)  # row 3: amax just below a power of two
        x[3, b * bs] = 2.0 ** (b % 3) * 0.999
    # rows 4-5: midpoints of the element grid, scaled: ties under nearest rounding
    mids = (elem[:-1] + elem[1:]) / 2
    x[4] = rng.choice(mids, cols) * rng.choice([-1.0, 1.0], cols)
    x[4, ::bs] = bf.element_max  # the block's amax is the element max: scale 1 (MX)
    x[5] = rng.choice(mids, cols) * rng.choice([-1.0, 1.0], cols) * 2.0**-3
    x[5, ::bs] = bf.element_max * 2.0**-3
    x[6] = rng.standard_normal(cols) * 1e-4  # small values, subnormal elements
    x[6, ::bs] = 1.0
    x[7] = 0.0  # all-zero blocks
    x[8] = rng.standard_normal(cols) * 1e-3
    x[8, 3::bs] = 1e3  # one large value per block
    return x.astype(np.float32)


def make_vector(
    block_format: str,
    scale_rule: str,
    rounding: str,
    *,
    hadamard: int = 0,
    seed: int = 1,
) -> dict[str, np.ndarray]:
    """The arrays of one vector (see the module docstring); inputs from ``seed``.

    >>> v = make_vector("mxfp8_e4m3", "floor", "nearest_even")
    >>> v["inputs"].shape, v["codes"].dtype, v["scale_codes"].shape, str(v["format"])
    ((16, 128), dtype('uint8'), (16, 4), 'mxfp8_e4m3')
    """
    bf = get_block_format(block_format, scale_rule=scale_rule)
    mode = check_rounding(rounding)
    x = _inputs(bf, seed + VECTOR_FORMATS.index(block_format))
    kw: dict[str, Any] = {"rounding": mode}
    extra: dict[str, np.ndarray] = {}
    if is_stochastic(mode):
        kw.update(seed=_SR_SEED, random_bits=_SR_BITS)
        extra = {
            "seed": np.array(_SR_SEED),
            "random_bits": np.array(_SR_BITS),
            "random_words": random_words(_SR_SEED, x.size).reshape(x.shape),
        }
    if hadamard:
        extra["hadamard_seed"] = np.array(_HADAMARD_SEED)
        extra["rotated"] = rotate(x, hadamard)
    q = quantize_blocks(rotate(x, hadamard) if hadamard else x, bf, **kw)
    return {
        "inputs": x,
        "codes": q.element_codes(),
        "scale_codes": q.scale_codes,
        "tensor_scale": np.array(q.tensor_scale, dtype=np.float32),
        "format": np.array(block_format),
        "scale_rule": np.array(scale_rule),
        "rounding": np.array(mode),
        "hadamard": np.array(hadamard),
        **extra,
    }


def _file_name(case: dict[str, Any]) -> str:
    h = f"_h{case['hadamard']}" if case["hadamard"] else ""
    return f"{case['format']}_{case['scale_rule']}_{case['rounding']}{h}.npz"


def write_vectors(out_dir: str | Path = CONFORMANCE_DIR) -> list[Path]:
    """Write every vector of :func:`vector_cases` into ``out_dir`` (compressed npz)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for case in vector_cases():
        path = out / _file_name(case)
        arrays = make_vector(
            case["format"], case["scale_rule"], case["rounding"], hadamard=case["hadamard"]
        )
        np.savez_compressed(path, **arrays)  # type: ignore[arg-type]
        paths.append(path)
    return paths


def vector_paths() -> list[Path]:
    """The shipped vector files, sorted."""
    return sorted(CONFORMANCE_DIR.glob("*.npz"))


# ----- reading --------------------------------------------------------------------------------
@dataclass
class ConformanceCase:
    """A third party's outputs for some inputs, and what they claim to implement."""

    inputs: np.ndarray
    codes: np.ndarray
    scale_codes: np.ndarray
    block_format: str | None = None
    scale_rule: str | None = None
    rounding: str = "nearest_even"
    tensor_scale: float | None = None
    seed: int | None = None
    random_bits: int | None = None
    hadamard: int = 0
    hadamard_seed: int | None = None
    source: str = ""


def _text(v: Any) -> str:
    return str(np.asarray(v).item()) if np.asarray(v).ndim == 0 else str(v)


def load_vector(path: str | Path) -> ConformanceCase:
    """Read an npz vector or a CSV file (``input,code,scale_code`` per element, ``# key=value``
    header lines). Raises ValueError naming the file and what is wrong.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    if p.suffix.lower() == ".npz":
        if not zipfile.is_zipfile(p):  # np.load would try it as a pickle, and say so
            raise ValueError(
                f"{p}: not a conformance vector file (an .npz is a zip archive of arrays "
                "inputs, codes and scale_codes; this file is not a zip archive)"
            )
        try:
            z = np.load(p, allow_pickle=False)
            data = {k: z[k] for k in z.files}
        except Exception as err:  # a damaged zip, not an npz
            raise ValueError(f"{p}: not a readable npz file ({err})") from None
        missing = [k for k in ("inputs", "codes", "scale_codes") if k not in data]
        if missing:
            raise ValueError(
                f"{p}: missing array(s) {', '.join(missing)} (npz keys: {sorted(data)})"
            )
        meta = {k: _text(data[k]) for k in ("format", "scale_rule", "rounding") if k in data}
        return ConformanceCase(
            inputs=data["inputs"],
            codes=data["codes"],
            scale_codes=data["scale_codes"],
            block_format=meta.get("format"),
            scale_rule=meta.get("scale_rule"),
            rounding=meta.get("rounding", "nearest_even"),
            tensor_scale=float(data["tensor_scale"]) if "tensor_scale" in data else None,
            seed=int(data["seed"]) if "seed" in data else None,
            random_bits=int(data["random_bits"]) if "random_bits" in data else None,
            hadamard=int(data["hadamard"]) if "hadamard" in data else 0,
            hadamard_seed=int(data["hadamard_seed"]) if "hadamard_seed" in data else None,
            source=str(p),
        )
    if p.suffix.lower() == ".csv":
        return _load_csv(p)
    raise ValueError(f"{p}: expected an .npz or .csv file")


def _load_csv(p: Path) -> ConformanceCase:
    meta: dict[str, str] = {}
    body = []
    for line in p.read_text().splitlines():
        s = line.strip()
        if s.startswith("#"):
            if "=" in s:
                k, v = s[1:].split("=", 1)
                meta[k.strip().lower()] = v.strip()
        elif s:
            body.append(s)
    if not body:
        raise ValueError(
            f"{p}: no rows (expected a header input,code,scale_code and one row per element)"
        )
    rows = list(csv.DictReader(io.StringIO("\n".join(body))))
    need = {"input", "code", "scale_code"}
    cols = set(rows[0]) if rows else set(body[0].split(","))
    if not need <= cols:
        raise ValueError(
            f"{p}: the header must name the columns input, code, scale_code; got {sorted(cols)}"
        )
    try:
        x = np.array([float(r["input"]) for r in rows], dtype=np.float32)
        codes = np.array([int(r["code"], 0) for r in rows])
        sc = np.array([int(r["scale_code"], 0) for r in rows])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{p}: a value does not parse ({err})") from None
    if (
        codes.min(initial=0) < 0
        or codes.max(initial=0) > 255
        or sc.min(initial=0) < 0
        or sc.max(initial=0) > 255
    ):
        raise ValueError(f"{p}: codes and scale codes must be in 0..255")
    fmt = meta.get("format")
    if fmt is None:
        raise ValueError(f"{p}: the file names no block format (a '# format=nvfp4' line)")
    bf = get_block_format(fmt)
    bs = bf.block_size
    if x.size % bs:
        raise ValueError(f"{p}: {x.size} elements, not a whole number of blocks of {bs}")
    per_block = sc.reshape(-1, bs)
    if (per_block != per_block[:, :1]).any():
        first = int(np.flatnonzero((per_block != per_block[:, :1]).any(axis=1))[0])
        raise ValueError(
            f"{p}: scale_code differs within block {first} (one scale per block of {bs})"
        )
    return ConformanceCase(
        inputs=x,
        codes=codes.astype(np.uint8),
        scale_codes=per_block[:, 0].astype(np.uint8),
        block_format=fmt,
        scale_rule=meta.get("scale_rule"),
        rounding=meta.get("rounding", "nearest_even"),
        tensor_scale=float(meta["tensor_scale"]) if "tensor_scale" in meta else None,
        seed=int(meta["seed"]) if "seed" in meta else None,
        random_bits=int(meta["random_bits"]) if "random_bits" in meta else None,
        hadamard=int(meta.get("hadamard", 0)),
        hadamard_seed=int(meta["hadamard_seed"]) if "hadamard_seed" in meta else None,
        source=str(p),
    )


# ----- checking -------------------------------------------------------------------------------
@dataclass
class ConformanceReport:
    """What :func:`check_conformance` found."""

    ok: bool
    block_format: str
    rounding: str
    blocks: int
    bad_blocks: int
    elements: int
    bad_elements: int
    bad_scales: int
    differences: list[dict[str, Any]] = field(default_factory=list)
    causes: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        """A few lines of text: the verdict, the causes, the first differences."""
        head = (
            f"{self.block_format} ({self.rounding}): {self.blocks} blocks, {self.elements} "
            f"elements: "
        )
        if self.ok:
            return head + "all codes and scales match"
        lines = [
            head + f"{self.bad_blocks} blocks differ ({self.bad_scales} scales, "
            f"{self.bad_elements} element codes)"
        ]
        for cause, n in self.causes.most_common():
            lines.append(f"  likely cause: {cause} ({n} blocks)")
        for d in self.differences:
            lines.append(
                f"  block {d['block']} element {d['element']}: input {d['input']!r}: "
                f"expected {d['expected']}, got {d['got']} -- {d['cause']}"
            )
        return "\n".join(lines)


def _codes_and_scales(x: np.ndarray, bf: BlockFormat, mode: str, seed: int | None,
                      random_bits: int | None) -> tuple[np.ndarray, np.ndarray, float]:  # fmt: skip
    kw: dict[str, Any] = {"rounding": mode}
    if is_stochastic(mode):
        kw.update(seed=seed if seed is not None else _SR_SEED, random_bits=random_bits)
    q = quantize_blocks(x, bf, **kw)
    return q.element_codes(), q.scale_codes, q.tensor_scale


def check_conformance(
    inputs: Any,
    codes: Any,
    scale_codes: Any,
    block_format: str | BlockFormat,
    *,
    scale_rule: str | None = None,
    rounding: str = "nearest_even",
    seed: int | None = None,
    random_bits: int | None = None,
    hadamard: int = 0,
    hadamard_seed: int | None = _HADAMARD_SEED,
    show: int = 5,
) -> ConformanceReport:
    """Compare a quantizer's element ``codes`` (one per input, or 4-bit codes packed two per byte
    along the last axis, even index in the low nibble) and block ``scale_codes`` with
    precision_lab's for the same ``inputs`` (blocks along the last axis), under ``block_format``
    with ``scale_rule`` (default: the format's) and the elements' ``rounding``; ``hadamard``
    (a size, 0: none) rotates the inputs first (:func:`rotate` with ``hadamard_seed``). Reports
    the first ``show`` differences and a likely cause per differing block (see the module
    docstring). A code outside its format's bits (an element code of 256 or more, 16 or more
    for FP4, a negative one; a scale code beyond the scale format's) is a ValueError, never
    wrapped; MX INT8 codes may also be given as signed bytes (-128..127).
    """
    bf = get_block_format(block_format, scale_rule=scale_rule)
    mode = check_rounding(rounding)
    x = np.asarray(inputs)
    if x.dtype.kind != "f":
        raise ValueError(f"inputs must be floats, got {x.dtype}")
    x = x.astype(np.float32) if x.dtype != np.float64 else x
    if x.ndim == 1:
        x = x.reshape(1, -1)
    got_c = np.asarray(codes)
    if got_c.dtype.kind not in "ui":
        raise ValueError(f"codes must be integers, got {got_c.dtype}")
    got_c = got_c.reshape(x.shape[:-1] + got_c.shape[-1:]) if got_c.ndim == 1 else got_c
    if bf.packed and got_c.shape[-1] == (x.shape[-1] + 1) // 2 and got_c.shape[-1] != x.shape[-1]:
        lo, hi = got_c & 0x0F, got_c >> 4
        got_c = np.stack([lo, hi], axis=-1).reshape(*got_c.shape[:-1], -1)[..., : x.shape[-1]]
    if got_c.shape != x.shape:
        raise ValueError(f"codes have shape {got_c.shape}, expected {x.shape} (one per input)")
    got_c = _checked_codes(got_c, bf.element, "codes")
    bs = bf.block_size
    if len(bf.block_shape) != 1 or x.shape[-1] % bs:
        raise ValueError(
            f"inputs' last axis ({x.shape[-1]}) must hold whole blocks of {bs} ({bf.name})"
        )
    if hadamard:  # the differences then show the rotated inputs
        x = rotate(x, hadamard, hadamard_seed)
    want_c, want_s, _ = _codes_and_scales(x, bf, mode, seed, random_bits)
    got_s = np.asarray(scale_codes)
    if got_s.dtype.kind not in "ui":
        raise ValueError(f"scale_codes must be integers, got {got_s.dtype}")
    got_s = _checked_codes(got_s, bf.scale, "scale_codes")
    if got_s.size != want_s.size:
        raise ValueError(
            f"scale_codes has {got_s.size} entries, expected {want_s.size} (one per block)"
        )
    got_s = got_s.reshape(want_s.shape).astype(want_s.dtype)
    nb = want_s.size
    xb = x.reshape(nb, bs)
    gcb, wcb = got_c.reshape(nb, bs), want_c.reshape(nb, bs)
    bad_scale = got_s.reshape(nb) != want_s.reshape(nb)
    bad_elem = gcb != wcb
    bad_block = bad_scale | bad_elem.any(axis=1)
    report = ConformanceReport(
        ok=not bad_block.any(),
        block_format=bf.name,
        rounding=mode,
        blocks=nb,
        bad_blocks=int(bad_block.sum()),
        elements=x.size,
        bad_elements=int(bad_elem.sum()),
        bad_scales=int(bad_scale.sum()),
    )
    if report.ok:
        return report
    alt_scales = {
        rule: _codes_and_scales(x, get_block_format(bf, scale_rule=rule), mode, seed, random_bits)[
            1
        ]
        for rule in _rules_for(bf)
        if rule != bf.scale_rule
    }
    alt_modes = {}
    for m in ("nearest_away", "nearest_zero", "toward_zero", "nearest_even"):
        if m != mode:
            alt_modes[m] = _codes_and_scales(x, bf, m, seed, random_bits)[0].reshape(nb, bs)
    emax = bf.element_max
    for b in (int(i) for i in np.flatnonzero(bad_block)):
        cause = _diagnose(
            b, bad_scale, got_s.reshape(nb), want_s.reshape(nb), alt_scales, bf, gcb, wcb,
            alt_modes, emax,
        )  # fmt: skip
        report.causes[cause] += 1
        if len(report.differences) < show:
            if bad_scale[b]:
                j, what = 0, "scale"
                exp, got = int(want_s.reshape(nb)[b]), int(got_s.reshape(nb)[b])
                exp_s = f"scale code {exp:#04x} ({_scale_value(exp, bf)})"
                got_s_ = f"scale code {got:#04x} ({_scale_value(got, bf)})"
            else:
                j = int(np.flatnonzero(bad_elem[b])[0])
                what = "element"
                exp_s = _elem_text(int(wcb[b, j]), bf)
                got_s_ = _elem_text(int(gcb[b, j]), bf)
            report.differences.append(
                {"block": int(b), "element": int(j), "what": what, "input": float(xb[b, j]),
                 "expected": exp_s, "got": got_s_, "cause": cause}
            )  # fmt: skip
    return report


def _checked_codes(codes: np.ndarray, fmt: Any, name: str) -> np.ndarray:
    """``codes`` as the unsigned codes of ``fmt``; a ValueError naming ``name``, the first code out
    of range and the range where a code does not fit ``fmt``'s bits (never wrapped modulo 2**bits:
    code 256 is no E4M3 code). Integer formats (MX INT8) also take their two's complement bytes
    as signed numbers (-128..-1)."""
    bits = int(fmt.bits)
    top = (1 << bits) - 1
    lo = -(1 << (bits - 1)) if isinstance(fmt, IntFormat) else 0
    c = codes.astype(np.int64) if codes.dtype != np.uint64 else codes
    bad = (c < lo) | (c > top) if c.dtype.kind == "i" else c > top
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        signed = f" (or {lo}..-1, two's complement)" if lo else ""
        raise ValueError(
            f"{name} must be codes of {fmt} ({bits} bits: 0..{top}{signed}), got "
            f"{int(c[where])} at index {where} ({int(bad.sum())} out of range)"
        )
    if lo:  # two's complement bytes
        c = c & top
    return c.astype(fmt.code_dtype)


def _scale_value(code: int, bf: BlockFormat) -> str:
    v = float(decode(np.array([code], dtype=np.uint8), bf.scale)[0])
    return f"2**{int(math.log2(v))}" if v > 0 and math.log2(v).is_integer() else repr(v)


def _elem_text(code: int, bf: BlockFormat) -> str:
    v = float(decode(np.array([code], dtype=np.uint8), bf.element)[0])
    return f"code {code:#04x} (element {v:g})"


def _diagnose(
    b: int,
    bad_scale: np.ndarray,
    got_s: np.ndarray,
    want_s: np.ndarray,
    alt_scales: dict[str, np.ndarray],
    bf: BlockFormat,
    gcb: np.ndarray,
    wcb: np.ndarray,
    alt_modes: dict[str, np.ndarray],
    emax: float,
) -> str:
    if bad_scale[b]:
        rules = [r for r, s in alt_scales.items() if s.reshape(-1)[b] == got_s[b]]
        if rules:
            return (
                f"scale rule: the block's scale follows rule {rules[0]!r} "
                f"(expected {bf.scale_rule!r})"
            )
        gv = decode(np.array([got_s[b]], dtype=np.uint8), bf.scale)[0]
        wv = decode(np.array([want_s[b]], dtype=np.uint8), bf.scale)[0]
        if gv > 0 and wv > 0 and math.log2(gv / wv).is_integer():
            return f"scale rule: the scale is 2**{int(math.log2(gv / wv))} times the expected one"
        return "scale: matches no known scale rule"
    bad = gcb[b] != wcb[b]
    gv = decode(gcb[b][bad].astype(np.uint8), bf.element).astype(np.float64)
    wv = decode(wcb[b][bad].astype(np.uint8), bf.element).astype(np.float64)
    if (~np.isfinite(gv) | (np.abs(gv) > emax)).any() and (np.abs(wv) == emax).any():
        return "saturation: values beyond the element max were not clamped to ±max"
    for m, codes in alt_modes.items():
        if (codes[b] == gcb[b]).all():
            if m in ("nearest_away", "nearest_zero", "nearest_even"):
                tie = {"nearest_away": "ties away from zero", "nearest_zero": "ties toward zero",
                       "nearest_even": "ties to even"}[m]  # fmt: skip
                return f"tie rule: the elements follow {m} ({tie})"
            return f"rounding: the elements follow {m}"
    return "element rounding: matches no rounding mode with these scales"


if __name__ == "__main__":  # pragma: no cover - regenerates the shipped vectors
    out = sys.argv[1] if len(sys.argv) > 1 else CONFORMANCE_DIR
    for path in write_vectors(out):
        print(path)
