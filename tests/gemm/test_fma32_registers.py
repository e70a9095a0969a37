"""The fp32 FMA kernel keeps its accumulators in registers (fma32.inc, as built).

The kernel's speed rests on the compiler's register allocation of one loop: a 6 x 16 tile of
float32 accumulators (12 of the 16 AVX2 registers; 24 of AVX-512's 32) updated by FMAs. Twice it
silently went wrong with GCC 12, each time halving a GEMM's speed while every result stayed
right: unrelated code added to the same translation unit made it spill the accumulators of
``fma32_tile`` (36 stack accesses in its loop: 31 -> 13 GMAC/s), and the promoted form
``fma32_tile_seg`` kept the output tile in registers across segments and spilled an accumulator
inside the k loop (seg 16 at 14 GMAC/s against 22-32). No result test can see either, so this
one reads the machine code: no instruction of the fp32 FMA routines moves a vector register to
or from the stack.
"""

from __future__ import annotations

import importlib
import platform
import re
import shutil
import subprocess

import pytest

native_kernels = importlib.import_module("precision_lab.backends.native.kernels")

pytestmark = [
    pytest.mark.skipif(not native_kernels.available(), reason="_native_kernels is not built"),
    pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed"),
    pytest.mark.skipif(
        platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 vector registers"
    ),
]

#: a vector register and a stack address in one instruction (AT&T syntax)
_SPILL = re.compile(r"%[yz]mm\d+.*\(%r[bs]p\)|\(%r[bs]p\).*%[yz]mm\d+")
#: a conditional or unconditional jump to an address
_JUMP = re.compile(r"\tj[a-z]+\s+([0-9a-f]+) <")


def _routines(path: str) -> dict[str, list[tuple[int, str]]]:
    """(address, instruction) of every fp32 FMA routine of the AVX2 and AVX-512 kernels."""
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out: dict[str, list[tuple[int, str]]] = {}
    name = None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            sym = head.group(1)
            keep = "fma32_rows" in sym and ("pl_avx2::" in sym or "pl_avx512::" in sym)
            name = sym if keep else None
            if name:
                out[name] = []
        elif name and "\t" in line:
            addr, _, ins = line.partition(":")
            out[name].append((int(addr, 16), ins))
    return out


def _fma_loops(body: list[tuple[int, str]]) -> list[list[str]]:
    """The loops that run the FMAs, as instruction lists: each innermost loop (a backward jump's
    range) holding a vfmadd, and the loop just around it (the K blocks or segments, where the
    accumulators are loaded and stored)."""
    loops = []
    for addr, ins in body:
        jump = _JUMP.search(ins)
        if jump and int(jump.group(1), 16) <= addr:
            loops.append((int(jump.group(1), 16), addr))
    inside = [(lo, hi) for lo, hi in loops if any(lo <= a <= hi and "vfmadd" in t for a, t in body)]
    inner = [r for r in inside if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in inside)]
    picked = set(inner)
    for lo, hi in inner:
        around = [o for o in loops if o != (lo, hi) and o[0] <= lo and hi <= o[1]]
        if around:
            picked.add(min(around, key=lambda o: o[1] - o[0]))
    return [[t for a, t in body if lo <= a <= hi] for lo, hi in sorted(picked)]


def spills(path: str) -> dict[str, list[str]]:
    """Per routine, the instructions of its FMA loops that move a vector register to or from
    the stack (none in a good build)."""
    found = {}
    for name, body in _routines(path).items():
        bad = [t for loop in _fma_loops(body) for t in loop if _SPILL.search(t)]
        if bad:
            found[name] = bad
    return found


def test_no_accumulator_goes_to_the_stack():
    path = native_kernels.ext.__file__
    routines = _routines(path)
    assert any("pl_avx2::" in n for n in routines), "no AVX2 fp32 FMA routine found"
    assert sum(len(_fma_loops(body)) for body in routines.values()) >= 4
    found = spills(path)
    assert not found, {n: (len(s), s[:3]) for n, s in found.items()}
