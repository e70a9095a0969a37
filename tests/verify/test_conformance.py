"""Conformance vectors (shipped in the package) and `precision-lab conform`: the vectors are what
the generator writes, precision_lab passes its own vectors, and deliberately wrong quantizers are
caught with the right cause (floor instead of ceil/RCEIL, ties away, no saturation)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.cli import main
from precision_lab.quant.block_formats import get_block_format
from precision_lab.verify import conformance as cf

#: RCEIL (the round-up E8M0 conversion of TE/cuBLAS) where the build has it, else the exact ceil
RCEIL = "rceil" if "rceil" in pl.quant.block_formats.SCALE_RULES else "ceil"


def test_shipped_vectors_are_what_the_generator_writes(tmp_path: Path) -> None:
    shipped = cf.vector_paths()
    assert len(shipped) == len(cf.vector_cases()) >= 28
    fresh = {p.name: p for p in cf.write_vectors(tmp_path)}
    assert sorted(fresh) == [p.name for p in shipped]
    for p in shipped:
        a, b = np.load(p), np.load(fresh[p.name])
        assert sorted(a.files) == sorted(b.files), p.name
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{p.name}: {k}")


def test_vectors_cover_formats_rules_and_modes() -> None:
    names = {p.name for p in cf.vector_paths()}
    for fmt in ("nvfp4", "mxfp4_e2m1", "mxfp8_e4m3"):
        assert any(n.startswith(fmt) for n in names)
    assert "mxfp4_e2m1_floor_nearest_even.npz" in names
    assert "mxfp4_e2m1_ceil_stochastic.npz" in names
    assert "nvfp4_amax_nearest_away.npz" in names
    if cf._hadamard_fn() is not None:  # the FP4-era rules and rotated vectors
        assert {
            "mxfp4_e2m1_rceil_nearest_even.npz",
            "nvfp4_4over6_mse_stochastic.npz",
            "nvfp4_amax_nearest_even_h16.npz",
            "mxfp8_e4m3_floor_stochastic_h32.npz",
        } <= names


@pytest.mark.parametrize("path", cf.vector_paths(), ids=lambda p: p.stem)
def test_each_vector_passes_and_decodes_to_round_to_blocks(path: Path) -> None:
    case = cf.load_vector(path)
    assert case.block_format is not None
    rep = cf.check_conformance(
        case.inputs, case.codes, case.scale_codes, case.block_format,
        scale_rule=case.scale_rule, rounding=case.rounding, seed=case.seed,
        random_bits=case.random_bits, hadamard=case.hadamard,
        **({"hadamard_seed": case.hadamard_seed} if case.hadamard_seed is not None else {}),
    )  # fmt: skip
    assert rep.ok, rep.summary()
    # the codes and scales decode to round_to_blocks' values (an independent path)
    bf = get_block_format(case.block_format, scale_rule=case.scale_rule)
    kw = {"seed": case.seed, "random_bits": case.random_bits} if case.seed is not None else {}
    x = cf.rotate(case.inputs, case.hadamard, case.hadamard_seed) if case.hadamard else case.inputs
    want = pl.round_to_blocks(x, bf, rounding=case.rounding, **kw)
    scales = pl.decode(case.scale_codes, bf.scale).astype(np.float64)
    elems = pl.decode(case.codes, bf.element).astype(np.float64)
    ts = case.tensor_scale if bf.tensor_scale else 1.0
    got = elems * np.repeat(scales, bf.block_size, axis=-1)
    got = (got.astype(np.float32) * np.float32(ts)) if bf.tensor_scale else got
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), want)


def _floor_for_rceil(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = pl.quantize_blocks(x, "mxfp8_e4m3")  # OCP floor
    return q.element_codes(), q.scale_codes


def _ties_away(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = pl.quantize_blocks(x, get_block_format("mxfp8_e4m3", scale_rule=RCEIL),
                           rounding="nearest_away")  # fmt: skip
    return q.element_codes(), q.scale_codes


def _no_saturation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bf = get_block_format("mxfp8_e4m3", scale_rule="floor")
    q = pl.quantize_blocks(x, bf)
    s = pl.decode(q.scale_codes, bf.scale).astype(np.float64)
    return pl.encode(x / np.repeat(s, 32, axis=-1), "e4m3", overflow="ieee"), q.scale_codes


@pytest.mark.parametrize(
    ("quantizer", "rule", "cause"),
    [
        (_floor_for_rceil, RCEIL, "scale rule: the block's scale follows rule 'floor'"),
        (_ties_away, RCEIL, "tie rule: the elements follow nearest_away"),
        (_no_saturation, "floor", "saturation"),
    ],
)
def test_wrong_quantizers_are_diagnosed(tmp_path: Path, capsys, quantizer, rule, cause) -> None:
    v = cf.make_vector("mxfp8_e4m3", rule, "nearest_even")
    codes, scales = quantizer(v["inputs"])
    rep = cf.check_conformance(v["inputs"], codes, scales, "mxfp8_e4m3", scale_rule=rule)
    assert not rep.ok
    assert len(rep.causes) == 1 and next(iter(rep.causes)).startswith(cause), rep.causes
    # through the command line: an npz naming format and rule, and a CSV
    f = tmp_path / "third_party.npz"
    np.savez(f, inputs=v["inputs"], codes=codes, scale_codes=scales, format="mxfp8_e4m3",
             scale_rule=rule)  # fmt: skip
    assert main(["conform", str(f)]) == 1
    out = capsys.readouterr().out
    assert "likely cause: " + cause in out and "block " in out
    assert main(["conform", str(f), "--json"]) == 1
    info = json.loads(capsys.readouterr().out)
    assert not info["ok"] and next(iter(info["causes"])).startswith(cause)
    c = tmp_path / "third_party.csv"
    x = v["inputs"].reshape(-1)
    sc = np.repeat(scales.reshape(-1), 32)
    lines = ["# format=mxfp8_e4m3", f"# scale_rule={rule}", "input,code,scale_code"]
    lines += [
        f"{float(a)!r},{int(b)},{int(s)}" for a, b, s in zip(x, codes.reshape(-1), sc, strict=True)
    ]
    c.write_text("\n".join(lines) + "\n")
    assert main(["conform", str(c)]) == 1
    assert "likely cause: " + cause in capsys.readouterr().out


def test_conform_passes_shipped_vectors_and_packed_codes(capsys) -> None:
    path = next(p for p in cf.vector_paths() if p.name == "nvfp4_amax_nearest_even.npz")
    assert main(["conform", str(path)]) == 0
    assert "all codes and scales match" in capsys.readouterr().out
    case = cf.load_vector(path)
    packed = (case.codes[:, 0::2] | (case.codes[:, 1::2] << 4)).astype(np.uint8)
    rep = cf.check_conformance(case.inputs, packed, case.scale_codes, "nvfp4")
    assert rep.ok


def test_bad_files_give_one_line_errors(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    missing = tmp_path / "missing.npz"
    np.savez(missing, inputs=np.zeros(32, np.float32), codes=np.zeros(32, np.uint8))
    nofmt = tmp_path / "nofmt.csv"
    nofmt.write_text("input,code,scale_code\n1.0,1,127\n")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("# format=mxfp4_e2m1\ninput,code,scale_code\n" + "1.0,2,127\n" * 31)
    cases = {
        tmp_path / "nothere.npz": "no such file",
        bad: "not a conformance vector file",
        missing: "missing array(s) scale_codes",
        nofmt: "names no block format",
        ragged: "not a whole number of blocks of 32",
        tmp_path / "x.txt": "expected an .npz or .csv file",
    }
    (tmp_path / "x.txt").write_text("hello")
    for path, msg in cases.items():
        assert main(["conform", str(path)]) == 1
        err = capsys.readouterr().err.strip()
        assert msg in err and "\n" not in err, err


def test_rotated_vectors_need_and_use_the_hadamard_transform() -> None:
    if cf._hadamard_fn() is None:
        with pytest.raises(ValueError, match="Hadamard rotation"):
            cf.make_vector("nvfp4", "amax", "nearest_even", hadamard=16)
        assert all(c["hadamard"] == 0 for c in cf.vector_cases())
        return
    v = cf.make_vector("nvfp4", "amax", "nearest_even", hadamard=16)
    rep = cf.check_conformance(v["inputs"], v["codes"], v["scale_codes"], "nvfp4", hadamard=16)
    assert rep.ok
    plain = cf.check_conformance(v["inputs"], v["codes"], v["scale_codes"], "nvfp4")
    assert not plain.ok  # the codes are those of the rotated inputs


# ----- the rotated vectors against an independent rotation --------------------------------------
def _sylvester(n: int) -> np.ndarray:
    """Sylvester's +-1 Hadamard matrix by Kronecker products (independent of pl.hadamard_matrix)."""
    h = np.array([[1]], dtype=np.int64)
    while h.shape[0] < n:
        h = np.kron(np.array([[1, 1], [1, -1]]), h)
    return h


def _signs(n: int, seed: int) -> np.ndarray:
    """The documented sign vector from the plain-Python Philox4x64-10 (not numpy's generator):
    sign i is -1 where the top bit of word i % 4 at counter (i // 4, 0, 0, 0) is set."""
    from precision_lab.core.random_words import philox4x64

    words = [w for c in range(-(-n // 4)) for w in philox4x64((c, 0, 0, 0), (seed, 0))][:n]
    return np.array([-1 if w >> 63 else 1 for w in words], dtype=np.int64)


def _independent_rotation(x: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``c * H_n (s * x)`` per block of n along the last axis: the signed sums exactly and
    correctly rounded by math.fsum (products by +-1 are exact), times 2**-k exactly (no
    subnormals here); for n = 2 * 4**k one more float64 multiply by fl64(2**-0.5), as the
    rotation is defined (module docstring of precision_lab.quant.hadamard)."""
    import math

    h, s = _sylvester(n), _signs(n, seed)
    lg = n.bit_length() - 1
    k, odd = lg // 2, lg % 2
    rows = x.astype(np.float64).reshape(-1, n) * s
    out = np.array([[math.fsum(r * hrow) for hrow in h] for r in rows]) * 2.0**-k
    if odd:
        out = out * np.float64(2.0**-0.5)
    return out.reshape(x.shape)


ROTATED = [p for p in cf.vector_paths() if "_h" in p.stem]


@pytest.mark.parametrize("path", ROTATED, ids=lambda p: p.stem)
def test_rotated_vectors_hold_the_rotation_of_their_inputs(path: Path) -> None:
    """Issue 31, item 5: the *_h16 / *_h32 files were written without the rotation (byte-identical
    to the plain ones). Each must hold ``hadamard`` = its size, and its codes and scales must be
    those of the library's quantizer on an independently rotated copy of ``inputs``."""
    n = int(path.stem.rsplit("_h", 1)[1])
    z = np.load(path)
    assert int(z["hadamard"]) == n, path.name
    seed = int(z["hadamard_seed"])
    rot = _independent_rotation(z["inputs"], n, seed)
    np.testing.assert_array_equal(z["rotated"], rot)  # -0.0 == 0.0 here
    # an exact zero (an all-zero block) has no sign; the butterfly's IEEE sums give some -0.0
    rot = np.where(rot == 0, z["rotated"], rot)
    bf = get_block_format(str(z["format"]), scale_rule=str(z["scale_rule"]))
    kw = {"seed": int(z["seed"]), "random_bits": int(z["random_bits"])} if "seed" in z else {}
    q = pl.quantize_blocks(rot, bf, rounding=str(z["rounding"]), **kw)
    np.testing.assert_array_equal(z["codes"], q.element_codes())
    np.testing.assert_array_equal(z["scale_codes"], q.scale_codes)
    plain = np.load(path.with_name(path.name.replace(f"_h{n}", "")))
    assert (plain["codes"] != z["codes"]).mean() > 0.5  # not the unrotated vector's codes
    # the dequantized values are the rotated inputs within the format's error, not the inputs
    vals = pl.dequantize_blocks(q).astype(np.float64)
    fin = np.isfinite(vals)
    err_rot = np.abs(vals - rot)[fin].sum()
    assert err_rot < 0.5 * np.abs(vals - z["inputs"])[fin].sum()


# ----- codes out of range -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fmt", "what", "add", "msg"),
    [
        ("mxfp8_e4m3", "codes", 256, "codes must be codes of e4m3 (8 bits: 0..255), got "),
        ("mxfp8_e4m3", "codes", -1000, "codes must be codes of e4m3 (8 bits: 0..255), got -"),
        ("mxfp4_e2m1", "codes", 16, "codes must be codes of e2m1 (4 bits: 0..15), got "),
        ("mxfp8_e5m2", "scale_codes", 256, "scale_codes must be codes of e8m0 (8 bits: 0..255)"),
        ("nvfp4", "scale_codes", 512, "scale_codes must be codes of e4m3 (8 bits: 0..255)"),
        ("mxint8", "codes", -1000, "codes must be codes of int8 (8 bits: 0..255 (or -128..-1"),
    ],
)
def test_codes_out_of_range_are_an_error(tmp_path: Path, capsys, fmt, what, add, msg) -> None:
    """Issue 31, item 7: conform wrapped element codes >= 256 (and scale codes) modulo 256 and
    reported "all codes and scales match"; a code beyond the format's bits is an error, in the
    API and on the command line (npz and CSV). Adding 256 keeps the wrapped code right: only the
    range check can reject it."""
    x = np.random.default_rng(3).standard_normal((4, 128)).astype(np.float32)
    q = pl.quantize_blocks(x, fmt)
    arrays = {"codes": q.element_codes().astype(np.int64),
              "scale_codes": q.scale_codes.astype(np.int64)}  # fmt: skip
    arrays[what][1, 3] += add
    with pytest.raises(ValueError, match=re.escape(msg)):
        cf.check_conformance(x, arrays["codes"], arrays["scale_codes"], fmt)
    f = tmp_path / "third_party.npz"
    np.savez(f, inputs=x, format=fmt, **arrays)
    assert main(["conform", str(f)]) == 1
    captured = capsys.readouterr()
    assert "all codes and scales match" not in captured.out
    assert msg in captured.err and "at index (1, 3)" in captured.err
    assert "\n" not in captured.err.strip()
    if fmt == "mxfp4_e2m1":  # a CSV row with a code of 16 or more
        c = tmp_path / "third_party.csv"
        sc = np.repeat(arrays["scale_codes"].reshape(-1), 32)
        rows = zip(x.reshape(-1), arrays["codes"].reshape(-1), sc, strict=True)
        lines = [f"# format={fmt}", "input,code,scale_code"]
        lines += [f"{float(a)!r},{int(b)},{int(s)}" for a, b, s in rows]
        c.write_text("\n".join(lines) + "\n")
        assert main(["conform", str(c)]) == 1
        assert msg in capsys.readouterr().err


def test_int8_codes_as_signed_bytes_are_accepted() -> None:
    """MX INT8 codes are two's complement bytes: as int8 (-128..-1) they are the same codes."""
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    q = pl.quantize_blocks(x, "mxint8")
    assert (q.codes.view(np.int8) < 0).any()
    assert cf.check_conformance(x, q.codes.view(np.int8), q.scale_codes, "mxint8").ok
