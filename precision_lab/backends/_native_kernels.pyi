"""Type stubs of the compiled GEMM, INT and block kernels (backends/native/module.cpp; loaded
by :mod:`precision_lab.backends.native.kernels`). Positional arguments only; buffers are
C-contiguous numpy arrays; ``r0``/``r1``, ``lo``/``hi``, ``q0``/``q1`` and ``u0``/``u1`` are
the ranges a call covers. tests/backends/test_native.py checks these names against the built
module."""

from typing import Any

SOURCE_HASH: str

def gemm(
    params: Any,
    A: Any,
    B: Any,
    C: Any,
    SA: Any,
    SB: Any,
    EA: Any,
    EB: Any,
    D: Any,
    r0: int,
    r1: int,
    flags: int = ...,
    B32: Any = ...,
    /,
) -> None: ...
def gemm_fma32(
    params: Any,
    A: Any,
    Bp: Any,
    C: Any,
    D: Any,
    same_out: int,
    r0: int,
    r1: int,
    grid_a: Any = ...,
    seg: int = ...,
    a_trans: int = ...,
    grid_out: Any = ...,
    /,
) -> int: ...
def fma32_pack(
    B: Any, Bp: Any, K: int, N: int, q0: int, q1: int, grid: Any = ..., b_trans: int = ..., /
) -> int: ...
def fma32_tile() -> tuple[int, int]: ...
def bfma_info(params: Any, opts: Any, /) -> tuple[int, int, int]: ...
def fma64_rows(
    A: Any, B: Any, C: Any, D: Any, M: int, N: int, K: int, r0: int, r1: int, /
) -> None: ...
def exact_block_rows(
    A: Any, B: Any, C: Any, D: Any, M: int, N: int, K: int, block: int, r0: int, r1: int, /
) -> None: ...
def pairwise32_rows(
    A: Any,
    B: Any,
    C: Any,
    D: Any,
    M: int,
    N: int,
    K: int,
    P: int,
    flush: int,
    r0: int,
    r1: int,
    /,
) -> None: ...
def bfma_grouped_rows(
    params: Any,
    opts: Any,
    A: Any,
    B: Any,
    SA: Any,
    SB: Any,
    ESA: Any,
    ESB: Any,
    C: Any,
    D: Any,
    G: int,
    kblock: int,
    r0: int,
    r1: int,
    grid: Any = ...,
    /,
) -> int: ...
def bfma_pack_b(
    params: Any,
    opts: Any,
    B: Any,
    Bs: Any,
    Be: Any,
    OB: Any,
    q0: int,
    q1: int,
    grid: Any = ...,
    sexp: Any = ...,
    /,
) -> tuple[int, int]: ...
def bfma_rows(
    params: Any,
    opts: Any,
    A: Any,
    Bs: Any,
    Be: Any,
    OB: Any,
    C: Any,
    D: Any,
    r0: int,
    r1: int,
    grid_a: Any,
    spread_b: int,
    sexp: Any = ...,
    /,
) -> int: ...
def align_exponents(x: Any, emin: int, out: Any, /) -> None: ...
def quantize(
    x: Any,
    out: Any,
    out_code: int,
    C: int,
    inner: int,
    S: Any,
    Z: Any,
    mode: int,
    short: int,
    torch: int,
    qmin: float,
    qmax: float,
    lo: int,
    hi: int,
    /,
) -> int: ...
def dequantize(
    q: Any,
    q_code: int,
    out: Any,
    short: int,
    C: int,
    inner: int,
    S: Any,
    Z: Any,
    lo: int,
    hi: int,
    /,
) -> None: ...
def blocks(
    x: Any,
    out: Any,
    dims: Any,
    rule: int,
    mode: int,
    codes_only: int,
    int_elem: int,
    int_bits: int,
    elem: Any,
    scale: Any,
    ints: Any,
    dbls: Any,
    values: Any,
    key: Any,
    u0: int,
    u1: int,
    /,
) -> None: ...
def block_amax(x: Any, dims: Any, out: Any, u0: int, u1: int, /) -> float: ...
def isa() -> str: ...
def hadamard(
    x: Any, out: Any, n: int, signs: Any, inverse: int, c: float, b0: int, b1: int, /
) -> None: ...
def hadamard_exact64(
    x: Any, out: Any, flags: Any, n: int, signs: Any, b0: int, b1: int, /
) -> None: ...
def hadamard_exact32(
    x: Any,
    out: Any,
    flags: Any,
    n: int,
    C: int,
    signs: Any,
    inverse: int,
    odd: int,
    c1: float,
    c2: float,
    b0: int,
    b1: int,
    /,
) -> None: ...
