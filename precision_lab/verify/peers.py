"""Third-party decoders and quantizers run over the library's vectors: where they depart.

``precision-lab conform --peer NAME`` (:func:`check_peer`) runs an installed peer over what the
library defines and names each departure. Decoders and casts disagree in the field; the checks:

``decode``
    every code of E4M3, E5M2, E2M1 and E8M0 decoded by the peer, against
    :func:`~precision_lab.decode` (NaN equals NaN, the sign of zero counts).
``ue4m3_bit7``
    NVFP4's block scales are unsigned E4M3 (UE4M3): the library never writes bit 7. How the peer
    reads the codes 0x80-0xFF as E4M3 is reported (a sign: ``-s``; NaN; or ignored), against the
    library's reading (a sign bit).
``cast_<fmt>``
    float32 values (the shipped vectors' inputs divided by their block scale, and probes at and
    beyond the format's largest value, infinities, NaN) cast by the peer to E4M3, E5M2 and E2M1,
    against the library's saturating round to nearest even (OCP "SAT", what MX elements use;
    :func:`~precision_lab.round_to` with ``overflow="saturate"``); a departure names the peer's
    overflow rule where it is one of the library's (``overflow="ieee"``).
``e8m0_round``
    values between and at the midpoints of powers of two rounded by the peer's cast to E8M0,
    against :func:`~precision_lab.round_to` (nearest, ties to the even code, as gfloat).
``quantize_<format>``
    the peer's block quantizer over the shipped vectors of that format (nearest even, no
    rotation): torchao's ``to_mx`` with the vector's scale rule, gfloat's ``quantize_block`` with
    ``compute_scale_amax`` (the OCP floor rule), checked by
    :func:`~precision_lab.verify.conformance.check_conformance` (torchao: codes and scale codes,
    with the diagnosed cause) or value by value (gfloat).

Peers: ``ml_dtypes``, ``torch``, ``gfloat`` (decode, ue4m3_bit7, casts, e8m0_round; gfloat
also its MX quantizer) and ``torchao`` (its quantizers ``to_mx`` and ``nvfp4_quantize``). What they
were found to do (ml_dtypes 0.7.0, torch 2.13.0, gfloat, torchao 0.18.0 on the CPU), as
``tests/verify/test_peers.py`` pins it: every decoder agrees on every code, and reads bit 7 of an
E4M3 scale code as a sign; ml_dtypes' E4M3 and E5M2 casts overflow as IEEE 754 (NaN / inf from
``max + ulp/2``: the library's ``overflow="ieee"``), not saturating, and its E2M1 cast turns NaN
into -0; torch saturates E4M3 (infinities to 448) but overflows E5M2 to inf; ml_dtypes and torch
round E8M0 ties up (``3 -> 4``, ``1.5 * 2**k -> 2**(k+1)`` for every k), the library and gfloat to
the even code (``3 -> 2``); gfloat's casts and MX quantizer and torchao's ``to_mx`` (four scale
rules) agree with the library everywhere; torchao's ``nvfp4_quantize`` (two-level scale) agrees
on every element code and departs on all-zero blocks only, whose E4M3 scale it clamps at
``E4M3_EPS`` (code 0x08, ``2**-6``) where the library's is 0.

>>> r = check_peer("ml_dtypes")
>>> sorted(c.name for c in r.checks)[:3]
['cast_e2m1', 'cast_e4m3', 'cast_e5m2']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.codec import decode
from ..core.formats import get_format
from ..core.rounding import round_to
from ..quant.block_formats import get_block_format
from ..quant.blocks import quantize_blocks
from .conformance import check_conformance, load_vector, vector_paths

__all__ = ["PEERS", "PeerCheck", "PeerReport", "check_peer"]

#: the peers :func:`check_peer` knows, and the package each needs
PEERS = {"ml_dtypes": "ml_dtypes", "torch": "torch", "gfloat": "gfloat", "torchao": "torchao"}
_ELEMENTS = ("e4m3", "e5m2", "e2m1")


@dataclass
class PeerCheck:
    """One check of a peer: how many values it covered, where the peer departs, and examples
    ``(input, library, peer)``."""

    name: str
    checked: int
    departed: int
    note: str = ""
    examples: list[tuple[Any, Any, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.departed == 0


@dataclass
class PeerReport:
    """What :func:`check_peer` found for one peer."""

    peer: str
    version: str
    checks: list[PeerCheck]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def summary(self) -> str:
        """One line per check; departures with their rule and examples."""
        lines = [f"{self.peer} {self.version}:"]
        for c in self.checks:
            verdict = "agrees" if c.ok else f"departs in {c.departed} of {c.checked}"
            lines.append(f"  {c.name}: {verdict}" + (f" -- {c.note}" if c.note else ""))
            for inp, lib, peer in c.examples:
                lines.append(f"    {inp!r}: precision_lab {lib!r}, {self.peer} {peer!r}")
        return "\n".join(lines)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: equal values with the same sign of zero, or both NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    with np.errstate(invalid="ignore"):
        return both_nan | ((a == b) & (np.signbit(a) == np.signbit(b)))


def _check(
    name: str, inputs: np.ndarray, lib: np.ndarray, peer: np.ndarray, note: Callable[..., str]
) -> PeerCheck:
    ok = _same(lib, peer)
    bad = np.flatnonzero(~ok)
    ex = [(_num(inputs.flat[i]), _num(lib.flat[i]), _num(peer.flat[i])) for i in bad[:3]]
    return PeerCheck(name, int(ok.size), int(bad.size), note(inputs, lib, peer, ok), ex)


def _num(v: Any) -> Any:
    f = float(v)
    return int(f) if f.is_integer() and abs(f) < 2**53 and not np.signbit(f) else f


# ----- the peers' decoders and casts ------------------------------------------------------------
def _ml_dtypes_codec() -> dict[str, Any]:
    ml = importlib.import_module("ml_dtypes")
    types = {
        "e4m3": ml.float8_e4m3fn,
        "e5m2": ml.float8_e5m2,
        "e2m1": ml.float4_e2m1fn,
        "e8m0": ml.float8_e8m0fnu,
    }

    def dec(codes: np.ndarray, fmt: str) -> np.ndarray:
        return codes.astype(np.uint8).view(types[fmt]).astype(np.float64)

    def cast(x: np.ndarray, fmt: str) -> np.ndarray:
        return x.astype(np.float32).astype(types[fmt]).astype(np.float64)

    return {"decode": dec, "cast": cast, "version": ml.__version__}


def _torch_codec() -> dict[str, Any]:
    torch = importlib.import_module("torch")
    types = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e8m0": torch.float8_e8m0fnu}

    def dec(codes: np.ndarray, fmt: str) -> np.ndarray | None:
        if fmt not in types:  # torch's FP4 is packed (float4_e2m1fn_x2): no scalar cast
            return None
        t = torch.from_numpy(codes.astype(np.uint8)).view(types[fmt])
        return t.to(torch.float64).numpy()

    def cast(x: np.ndarray, fmt: str) -> np.ndarray | None:
        if fmt not in types:
            return None
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(types[fmt])
        return t.to(torch.float64).numpy()

    return {"decode": dec, "cast": cast, "version": torch.__version__}


def _gfloat_codec() -> dict[str, Any]:
    gfloat = importlib.import_module("gfloat")
    gf = importlib.import_module("gfloat.formats")
    fis = {
        "e4m3": gf.format_info_ocp_e4m3,
        "e5m2": gf.format_info_ocp_e5m2,
        "e2m1": gf.format_info_ocp_e2m1,
        "e8m0": gf.format_info_ocp_e8m0,
    }

    def dec(codes: np.ndarray, fmt: str) -> np.ndarray:
        return np.asarray(gfloat.decode_ndarray(fis[fmt], codes.astype(np.int64)), np.float64)

    def cast(x: np.ndarray, fmt: str) -> np.ndarray:
        sat = fmt != "e8m0"  # gfloat's saturating conversion (OCP SAT) for the elements
        v = x.astype(np.float64)
        return np.asarray(gfloat.round_ndarray(fis[fmt], v, gfloat.RoundMode.TiesToEven, sat))

    version = getattr(gfloat, "__version__", "")
    return {"decode": dec, "cast": cast, "version": version}


_CODECS = {"ml_dtypes": _ml_dtypes_codec, "torch": _torch_codec, "gfloat": _gfloat_codec}


def _decode_checks(codec: dict[str, Any]) -> list[PeerCheck]:
    out = []
    for fmt in ("e4m3", "e5m2", "e2m1", "e8m0"):
        f = get_format(fmt)
        codes = np.arange(2**f.bits, dtype=np.uint8)
        peer = codec["decode"](codes, fmt)
        if peer is None:
            continue
        lib = decode(codes, f).astype(np.float64)
        out.append(_check(f"decode_{fmt}", codes, lib, peer, lambda *a: ""))
    codes = np.arange(0x80, 0x100, dtype=np.uint8)
    peer = codec["decode"](codes, "e4m3")
    lib = decode(codes, get_format("e4m3")).astype(np.float64)
    pos = decode(codes & np.uint8(0x7F), get_format("e4m3")).astype(np.float64)
    with np.errstate(invalid="ignore"):
        reading = (
            "a sign (-s)"
            if _same(peer, -pos).all()
            else "ignored (s)"
            if _same(peer, pos).all()
            else "mixed"
        )
    out.append(
        _check(
            "ue4m3_bit7",
            codes,
            lib,
            peer,
            lambda *a: f"bit 7 of a UE4M3 scale code read as {reading}; precision_lab: a sign",
        )
    )
    return out


def _vector_elements(fmt: str) -> np.ndarray:
    """The shipped vectors' inputs over their block scales (float32 exact: power-of-two MX
    scales), for the MX vectors of element format ``fmt`` (nearest even, no rotation)."""
    parts = []
    for p in vector_paths():
        case = load_vector(p)
        if case.rounding != "nearest_even" or case.hadamard or not case.block_format:
            continue
        bf = get_block_format(case.block_format, scale_rule=case.scale_rule)
        if bf.element.name != fmt or bf.tensor_scale:
            continue
        q = quantize_blocks(case.inputs, bf)
        s = np.repeat(q.scales, bf.block_size, axis=-1)
        with np.errstate(all="ignore"):
            parts.append((case.inputs.astype(np.float64) / s).ravel())
    return np.concatenate(parts) if parts else np.zeros(0)


def _overflow_note(x: np.ndarray, lib: np.ndarray, peer: np.ndarray, ok: np.ndarray, fmt: str):
    if ok.all():
        return "saturating round to nearest even, as the library's MX elements"
    f = get_format(fmt)
    ieee = round_to(x, f, overflow="ieee").astype(np.float64)
    notes = []
    if _same(ieee, peer).all():
        return "overflows by IEEE 754 (NaN/inf at max + ulp/2), not saturating"
    big = np.abs(x) > float(f.max)
    bad = ~ok
    if (bad & big).any():
        lo = (
            float(np.abs(x[bad & big & ~np.isinf(x)]).min())
            if (bad & big & ~np.isinf(x)).any()
            else None
        )
        what = np.unique(peer[bad & big])
        notes.append(
            f"beyond max gives {', '.join(str(_num(v)) for v in what[:3])}"
            + (f" from |x| = {_num(lo)}" if lo is not None else "")
        )
    if (bad & np.isnan(x)).any():
        notes.append(f"NaN gives {_num(peer[bad & np.isnan(x)][0])}")
    if (bad & ~big & ~np.isnan(x)).any():
        notes.append("in-range values round differently")
    return "; ".join(notes)


def _cast_checks(codec: dict[str, Any]) -> list[PeerCheck]:
    out = []
    for fmt in _ELEMENTS:
        f = get_format(fmt)
        m = float(f.max)
        probes = np.array(
            [m, m * 1.0625, m * 1.125 - 1e-3 * m, m * 1.125, m * 1.25, m * 2, 1e30, np.inf,
             -np.inf, np.nan, -m * 1.2, 0.0, -0.0],
        )  # fmt: skip
        x = np.concatenate([probes, _vector_elements(fmt)]).astype(np.float32).astype(np.float64)
        peer = codec["cast"](x, fmt)
        if peer is None:
            continue
        lib = round_to(x, f, overflow="saturate").astype(np.float64)
        out.append(
            _check(
                f"cast_{fmt}", x, lib, peer, lambda x, lib, peer, ok, fmt=fmt: _overflow_note(
                    x, lib, peer, ok, fmt)
            )
        )  # fmt: skip
    ks = np.arange(-20, 21, dtype=np.float64)
    x = np.concatenate([np.exp2(ks) * r for r in (1.0, 1.25, 1.5, 1.75, 2**0.5)]).astype(np.float32)
    x = x.astype(np.float64)
    peer = codec["cast"](x, "e8m0")
    if peer is not None:
        lib = round_to(x, get_format("e8m0")).astype(np.float64)

        def note(x: np.ndarray, lib: np.ndarray, peer: np.ndarray, ok: np.ndarray) -> str:
            if ok.all():
                return "nearest, ties to the even code"
            ties = np.isin(x / np.exp2(np.floor(np.log2(x))), (1.5,))
            up = (~ok & ties & (peer > lib)).sum()
            return f"ties (1.5 * 2**k) rounded up in {up} of {int(ties.sum())}" if up else ""

        out.append(_check("e8m0_round", x, lib, peer, note))
    return out


# ----- the peers' quantizers ----------------------------------------------------------------------
_TORCHAO_RULES = {"floor": "FLOOR", "ceil_emax": "CEIL", "nearest_even": "EVEN", "rceil": "RCEIL"}


def _torchao_checks() -> tuple[list[PeerCheck], str]:
    torch = importlib.import_module("torch")
    mx = importlib.import_module("torchao.prototype.mx_formats.mx_tensor")
    cfg = importlib.import_module("torchao.prototype.mx_formats.config")
    version = importlib.import_module("torchao").__version__
    dtypes = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2,
              "mxfp4_e2m1": torch.float4_e2m1fn_x2}  # fmt: skip
    out = []
    for p in vector_paths():
        case = load_vector(p)
        rule = case.scale_rule or "floor"
        if (
            case.block_format not in dtypes
            or case.rounding != "nearest_even"
            or case.hadamard
            or rule not in _TORCHAO_RULES
        ):
            continue
        x = np.ascontiguousarray(case.inputs, dtype=np.float32)
        mode = getattr(cfg.ScaleCalculationMode, _TORCHAO_RULES[rule])
        scale, data = mx.to_mx(torch.from_numpy(x.copy()), dtypes[case.block_format], 32, mode)
        sc = scale.view(torch.uint8).numpy().reshape(x.shape[0], -1)
        d = data.view(torch.uint8).numpy().reshape(x.shape[0], -1)
        rep = check_conformance(x, d, sc, case.block_format, scale_rule=rule, show=2)
        causes = ", ".join(f"{c} ({n} blocks)" for c, n in rep.causes.most_common())
        ex = [(d_["input"], d_["expected"], d_["got"]) for d_ in rep.differences[:2]]
        out.append(
            PeerCheck(
                f"quantize_{case.block_format}[{rule}]", rep.blocks, rep.bad_blocks, causes, ex
            )
        )
    out += _torchao_nvfp4_checks(torch)
    return out, version


def _torchao_nvfp4_checks(torch: Any) -> list[PeerCheck]:
    """torchao's ``nvfp4_quantize`` with its two-level scale (``per_tensor_amax_to_scale`` of
    the tensor's amax) over the NVFP4 vectors of the ``"amax"`` rules (torchao has no 4/6)."""
    nv = importlib.import_module("torchao.prototype.mx_formats.nvfp4_tensor")
    out = []
    for p in vector_paths():
        case = load_vector(p)
        rule = case.scale_rule or "amax"
        if (
            case.block_format != "nvfp4"
            or rule not in ("amax", "amax_div")
            or case.rounding != "nearest_even"
            or case.hadamard
        ):
            continue
        x = torch.from_numpy(np.ascontiguousarray(case.inputs, dtype=np.float32))
        ts = nv.per_tensor_amax_to_scale(torch.amax(torch.abs(x)))
        sc, d = nv.nvfp4_quantize(x, 16, ts)
        rep = check_conformance(
            case.inputs, d.view(torch.uint8).numpy(), sc.view(torch.uint8).numpy(), "nvfp4",
            scale_rule=rule, show=2,
        )  # fmt: skip
        zero = [d_ for d_ in rep.differences if d_["what"] == "scale" and d_["input"] == 0]
        note = ", ".join(f"{c} ({n} blocks)" for c, n in rep.causes.most_common())
        if zero and rep.bad_elements == 0:
            note = (
                f"all-zero blocks get {zero[0]['got']} (torchao clamps the block scale at "
                f"E4M3_EPS), precision_lab {zero[0]['expected']}; every element code agrees"
            )
        ex = [(d_["input"], d_["expected"], d_["got"]) for d_ in rep.differences[:2]]
        out.append(PeerCheck(f"quantize_nvfp4[{rule}]", rep.blocks, rep.bad_blocks, note, ex))
    return out


def _gfloat_quantize_checks() -> list[PeerCheck]:
    gf = importlib.import_module("gfloat.formats")
    blk = importlib.import_module("gfloat.block")
    out = []
    for p in vector_paths():
        case = load_vector(p)
        name = case.block_format or ""
        fi = getattr(gf, f"format_info_{name}", None)
        if (
            fi is None
            or not name.startswith("mx")
            or (case.scale_rule or "floor") != "floor"
            or case.rounding != "nearest_even"
            or case.hadamard
        ):
            continue
        x = case.inputs.astype(np.float64)
        lib = np.asarray(quantize_blocks(x, name).dequantize(), np.float64)
        rows = x.reshape(-1, 32)
        with np.errstate(all="ignore"):
            peer = np.stack([blk.quantize_block(fi, r, blk.compute_scale_amax) for r in rows])
        out.append(
            _check(
                f"quantize_{name}",
                rows,
                lib.reshape(rows.shape),
                peer,
                lambda *a: "OCP floor rule (compute_scale_amax)",
            )
        )
    return out


def check_peer(peer: str) -> PeerReport:
    """Run the installed ``peer`` (a key of :data:`PEERS`) over the library's codes, probes and
    shipped vectors, and report where it departs (module docstring). ImportError (naming the
    package) where the peer is not installed; ValueError for an unknown peer.
    """
    if peer not in PEERS:
        raise ValueError(f"peer must be one of {', '.join(PEERS)}, got {peer!r}")
    try:
        importlib.import_module(PEERS[peer])
    except ImportError:
        raise ImportError(
            f"peer {peer!r} needs the package {PEERS[peer]!r} (pip install 'precision_lab[test]')"
        ) from None
    if peer == "torchao":
        checks, version = _torchao_checks()
        return PeerReport(peer, version, checks)
    codec = _CODECS[peer]()
    checks = _decode_checks(codec) + _cast_checks(codec)
    if peer == "gfloat":
        checks += _gfloat_quantize_checks()
    return PeerReport(peer, str(codec["version"]), checks)
