"""Type stubs of the compiled cast backend (backends/native/core.cpp; loaded by
:mod:`precision_lab.backends.native`). Every function takes positional arguments only; buffers
are C-contiguous numpy arrays, ``fmt`` is the tuple of ``kernel_sources.format_args``, ``lo`` and
``hi`` the element range a call covers. tests/backends/test_native.py checks these names
against the built module."""

from typing import Any

SOURCE_HASH: str
BLOCK: int
FAST_MODES: int

_Fmt = tuple[int, int, int, int, int]

def round_float(
    src: Any,
    src_itemsize: int,
    out: Any,
    out_itemsize: int,
    fmt: _Fmt,
    mode: int,
    saturate: int,
    flush: int,
    seed_lo: int,
    seed_hi: int,
    random_bits: int,
    lo: int,
    hi: int,
    /,
) -> int: ...
def encode_float(
    src: Any,
    src_itemsize: int,
    out: Any,
    code_itemsize: int,
    fmt: _Fmt,
    mode: int,
    saturate: int,
    flush: int,
    seed_lo: int,
    seed_hi: int,
    random_bits: int,
    lo: int,
    hi: int,
    /,
) -> int: ...
def round_int(
    src: Any,
    src_itemsize: int,
    out: Any,
    out_itemsize: int,
    bits: int,
    signed: int,
    mode: int,
    seed_lo: int,
    seed_hi: int,
    random_bits: int,
    lo: int,
    hi: int,
    /,
) -> int: ...
def encode_int(
    src: Any,
    src_itemsize: int,
    out: Any,
    code_itemsize: int,
    bits: int,
    signed: int,
    mode: int,
    seed_lo: int,
    seed_hi: int,
    random_bits: int,
    lo: int,
    hi: int,
    /,
) -> int: ...
def decode_table(
    codes: Any,
    code_itemsize: int,
    code_signed: bool,
    table: Any,
    out: Any,
    out_itemsize: int,
    lo: int,
    hi: int,
    /,
) -> int: ...
def decode_float(
    codes: Any,
    code_itemsize: int,
    code_signed: bool,
    out: Any,
    out_itemsize: int,
    fmt: _Fmt,
    lo: int,
    hi: int,
    /,
) -> int: ...
def decode_int(
    codes: Any,
    code_itemsize: int,
    code_signed: bool,
    out: Any,
    out_itemsize: int,
    bits: int,
    signed: int,
    lo: int,
    hi: int,
    /,
) -> int: ...
def elementwise(
    x: Any,
    x_kind: int,
    y: Any,
    y_kind: int,
    z: Any,
    z_kind: int,
    out: Any,
    op: int,
    fmt: _Fmt,
    mode: int,
    saturate: int,
    flush: int,
    on_grid: bool,
    seed_lo: int,
    seed_hi: int,
    random_bits: int,
    lo: int,
    hi: int,
    /,
) -> int: ...
def random_words(
    out: Any, seed_lo: int, seed_hi: int, random_bits: int, start: int, path: int = -1, /
) -> None: ...
def philox_paths() -> tuple[list[int], int]: ...
def fast_paths(
    fmt: _Fmt, mode: int, saturate: int, flush: int, itemsize: int, /
) -> tuple[bool, bool, bool]: ...
