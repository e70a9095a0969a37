"""Measured tensor-core data (Khattak & Mikaitis 2025) and the check of the presets against it.

The data sets are single matrix-multiply-accumulate instructions recorded on real GPUs: for each
case, K inputs a and b, the accumulator input c and the GPU's result d (fp32 output, and fp16
output where recorded). :func:`load_archive` reads a ``GPU_FORMAT.tgz`` archive of
``shared/data/tensor-core-validation`` as it is (no unpacking); :func:`load_subset` reads the
compressed subset shipped with the tests; :func:`check_set` runs :func:`~precision_lab.gemm` with
the matching :func:`~precision_lab.tensor_core` preset and counts bit-exact matches.

>>> import numpy as np
>>> case = TensorCoreSet("V100", "fp16", a=np.array([[1.0, 1, 1, 1]], np.float32),
...     b=np.array([[2.0, 3 * 2.0**-24, 0, 0]], np.float32), c=np.zeros(1, np.float32),
...     d={"fp32": np.array([2.0], np.float32)})
>>> check_set(case, "fp32").matches
1
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .reference import gemm
from .tensor_core import measured_preset

__all__ = ["SetResult", "TensorCoreSet", "check_set", "load_archive", "load_subset"]


@dataclass
class TensorCoreSet:
    """One measured data set: inputs (float32 arrays holding exact values) and GPU results."""

    gpu: str  # as in the archive names: V100, A100, Ada, H100, B200 ...
    fmt: str  # fp16, bf16, tf32, E4M3, E5M2
    a: np.ndarray  # (cases, K)
    b: np.ndarray  # (cases, K)
    c: np.ndarray  # (cases,)
    d: dict[str, np.ndarray] = field(default_factory=dict)  # output format -> (cases,)

    @property
    def name(self) -> str:
        return f"{self.gpu}_{self.fmt}"

    def head(self, n: int) -> TensorCoreSet:
        """The first ``n`` cases."""
        return TensorCoreSet(
            self.gpu, self.fmt, self.a[:n], self.b[:n], self.c[:n],
            {k: v[:n] for k, v in self.d.items()},
        )  # fmt: skip


@dataclass
class SetResult:
    """Matches of one (set, output format)."""

    name: str
    out_format: str
    matches: int
    cases: int
    mismatches: np.ndarray  # indices of the cases that differ

    def __str__(self) -> str:
        return f"{self.name} -> {self.out_format}: {self.matches}/{self.cases}"


def _hex_rows(text: str) -> np.ndarray:
    rows = [line.split() for line in text.splitlines() if line.strip()]
    return np.array([[int(h, 16) for h in r] for r in rows], dtype=np.uint32).view(np.float32)


def _bin_rows(text: str) -> np.ndarray:
    vals = [int(line.strip(), 2) for line in text.splitlines() if line.strip()]
    return np.array(vals, dtype=np.uint32).view(np.float32)


def load_archive(path: str | Path) -> TensorCoreSet:
    """Read ``GPU_FORMAT.tgz`` (``GPU/FORMAT/{a,b,c,d}_*.txt`` inside) into a set."""
    path = Path(path)
    gpu, fmt = path.name.removesuffix(".tgz").split("_", 1)
    files: dict[str, str] = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".txt"):
                fh = tar.extractfile(member)
                assert fh is not None
                files[Path(member.name).name] = io.TextIOWrapper(fh).read()
    a = _hex_rows(files[f"a_{gpu}_{fmt}.txt"])
    b = _hex_rows(files[f"b_{gpu}_{fmt}.txt"])
    c = _bin_rows(files[f"c_{gpu}_fp32.txt"])
    d = {o: _bin_rows(files[f"d_{gpu}_{o}.txt"]) for o in ("fp32", "fp16")
         if f"d_{gpu}_{o}.txt" in files}  # fmt: skip
    return TensorCoreSet(gpu, fmt, a, b, c, d)


def save_subset(sets: list[TensorCoreSet], path: str | Path) -> None:
    """Write sets as one compressed ``.npz`` of float32 bit patterns (uint32)."""
    arrays: dict[str, np.ndarray] = {}
    for s in sets:
        arrays[f"{s.name}/a"] = s.a.view(np.uint32)
        arrays[f"{s.name}/b"] = s.b.view(np.uint32)
        arrays[f"{s.name}/c"] = s.c.view(np.uint32)
        for o, v in s.d.items():
            arrays[f"{s.name}/d_{o}"] = v.view(np.uint32)
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]


def load_subset(path: str | Path) -> list[TensorCoreSet]:
    """Read the sets written by :func:`save_subset`."""
    with np.load(path) as z:
        names = sorted({k.split("/")[0] for k in z.files})
        out = []
        for name in names:
            gpu, fmt = name.split("_", 1)
            d = {k.split("/d_")[1]: z[k].view(np.float32) for k in z.files
                 if k.startswith(f"{name}/d_")}  # fmt: skip
            out.append(TensorCoreSet(
                gpu, fmt, z[f"{name}/a"].view(np.float32), z[f"{name}/b"].view(np.float32),
                z[f"{name}/c"].view(np.float32), d,
            ))  # fmt: skip
    return out


def check_set(s: TensorCoreSet, out_format: str) -> SetResult:
    """Run the preset of ``s.gpu`` on every case of ``s`` and compare bit patterns with the GPU.

    The preset is that of the instruction the set was recorded with
    (:func:`~precision_lab.gemm.tensor_core.measured_preset`: ``mma``, and ``wgmma`` for Hopper
    FP8 with fp32 output). That instruction ran with a zero accumulator, so c is taken as 0
    there, as in the published validation.
    """
    gpu, fmt = s.gpu.lower(), s.fmt.lower()
    acc = measured_preset(gpu, fmt, out_format)
    c = s.c
    if gpu in ("h100", "h200") and fmt in ("e4m3", "e5m2") and out_format == "fp32":
        c = np.zeros_like(c)
    d = gemm(
        s.a[:, None, :], s.b[:, :, None], c[:, None, None], input_format=fmt,
        accumulator=acc, out_format=out_format, input_rounding="exact",
    )[:, 0, 0].astype(np.float32)  # fmt: skip
    ref = s.d[out_format]
    same = d.view(np.uint32) == ref.view(np.uint32)
    return SetResult(s.name, out_format, int(same.sum()), len(ref), np.flatnonzero(~same))
