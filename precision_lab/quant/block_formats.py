"""Block formats: what a block-scaled format is, and the registry of named ones.

A :class:`BlockFormat` names an element format, a scale format, a block shape and a scale rule
(:data:`SCALE_RULES`); :data:`BLOCK_FORMATS` holds OCP MX (FP8, FP6, FP4, INT8), NVFP4, the two
other block shapes matrix cores take (``mxfp4_e2m1_b16``, ``nvfp4_b32``) and the DeepSeek-V3 FP8
tiles. The arithmetic that uses them is in :mod:`precision_lab.quant.blocks`.

>>> get_block_format("nvfp4").block_shape
(16,)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..core.formats import FloatFormat, IntFormat, get_format

#: How a block's scale is chosen from its largest magnitude (defined in
#: :mod:`~precision_lab.quant.blocks`).
SCALE_RULES = (
    "floor",
    "ceil",
    "amax",
    "nearest_even",
    "rceil",
    "amax_div",
    "4over6_mse",
    "4over6_mae",
    "ceil_emax",
)
#: the rules that give power-of-two scales (MX: E8M0)
POW2_RULES = ("floor", "ceil", "nearest_even", "rceil", "ceil_emax")
#: the rules of formats with NVFP4's per-tensor FP32 scale
TENSOR_RULES = ("amax", "amax_div", "4over6_mse", "4over6_mae")


__all__ = [
    "BLOCK_FORMATS",
    "POW2_RULES",
    "SCALE_RULES",
    "TENSOR_RULES",
    "BlockFormat",
    "get_block_format",
    "known_block_formats",
]


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: element format, scale format, block shape and scale rule.

    Parameters
    ----------
    name:
        Display name.
    element:
        Element format (name or format object): ``"e4m3"``, ``"e2m1"``, ``"int8"`` ...
    scale:
        Scale format: ``"e8m0"`` (MX), ``"e4m3"`` (NVFP4), ``"fp32"`` (DeepSeek-V3 tiles).
    block_shape:
        ``(n,)``: blocks of n consecutive elements along the blocked axis; ``(r, c)``: 2-D tiles
        over the last two axes.
    scale_rule:
        One of :data:`SCALE_RULES`: power-of-two scales ``"floor"`` (OCP), ``"ceil"``,
        ``"nearest_even"``, ``"rceil"``, ``"ceil_emax"`` (torchao's CEIL) (:data:`POW2_RULES`);
        ``"amax"`` (scale ``amax / elem_max`` rounded to the scale format); with NVFP4's tensor
        scale also ``"amax_div"``, ``"4over6_mse"``, ``"4over6_mae"`` (:data:`TENSOR_RULES`).
        :mod:`~precision_lab.quant.blocks` defines each.
    element_exponent:
        Elements are ``code * 2**element_exponent``: -6 for MX INT8, whose elements are the
        fixed-point numbers ``k/64``, ``k`` in -127..127 (1.6 format); 0 otherwise.
    tensor_scale:
        NVFP4's second-level per-tensor FP32 scale (with a rule of :data:`TENSOR_RULES`).
    tensor_scale_bound:
        With ``tensor_scale``: the block-scale value the tensor's largest block amax is mapped
        to, ``S_enc = elem_max * tensor_scale_bound / amax_tensor``. None: the scale format's
        maximum (448 for E4M3: the ``448 * 6`` bound of NVIDIA's recipe); the 4/6 rules default
        to 256 (the ``256 * 6`` bound, which leaves room for the 1.5x larger scale of a block
        mapped to 4: ``256 * 1.5 = 384 <= 448``).

    Examples
    --------
    >>> f = get_block_format("mxfp4_e2m1")
    >>> f.element_max, f.element_emax, f.block_size, f.bits_per_element
    (6.0, 2, 32, 4.25)
    >>> get_block_format("mxint8").element_max
    1.984375
    """

    name: str
    element: FloatFormat | IntFormat
    scale: FloatFormat
    block_shape: tuple[int, ...]
    scale_rule: str = "floor"
    element_exponent: int = 0
    tensor_scale: bool = False
    tensor_scale_bound: float | None = None
    _emax: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        elem = get_format(self.element, name="element")
        scale = get_format(self.scale, name="scale")
        object.__setattr__(self, "element", elem)
        object.__setattr__(self, "scale", scale)
        if not isinstance(scale, FloatFormat):
            raise ValueError(f"scale must be a floating-point format, got {scale}")
        shape = tuple(self.block_shape)
        if len(shape) not in (1, 2) or not all(
            isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 1 for n in shape
        ):
            raise ValueError(
                "block_shape must be (n,) or (rows, cols) of positive ints, "
                f"got {self.block_shape!r}"
            )
        object.__setattr__(self, "block_shape", tuple(int(n) for n in shape))
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {self.scale_rule!r}")
        if self.tensor_scale and self.scale_rule not in TENSOR_RULES:
            raise ValueError(
                f"tensor_scale=True (NVFP4) needs a scale_rule of {TENSOR_RULES}, "
                f"got {self.scale_rule!r}"
            )
        if not self.tensor_scale and self.scale_rule in TENSOR_RULES[1:]:
            raise ValueError(
                f"scale_rule={self.scale_rule!r} needs NVFP4's per-tensor scale (tensor_scale=True)"
            )
        if self.tensor_scale_bound is not None:
            b = self.tensor_scale_bound
            if not self.tensor_scale:
                raise ValueError("tensor_scale_bound needs tensor_scale=True")
            if (
                isinstance(b, bool)
                or not isinstance(b, int | float | np.integer | np.floating)
                or not (0 < float(b) <= float(scale.max))
            ):
                raise ValueError(
                    f"tensor_scale_bound must be a number in (0, {float(scale.max)}] (the scale "
                    f"format's range), got {b!r}"
                )
            object.__setattr__(self, "tensor_scale_bound", float(b))
        if isinstance(elem, IntFormat) and not elem.signed:
            raise ValueError(f"integer elements must be signed, got {elem}")
        if not isinstance(self.element_exponent, int):
            raise ValueError(f"element_exponent must be an int, got {self.element_exponent!r}")
        if self.element_exponent and self.scale_rule not in POW2_RULES:
            raise ValueError(f"element_exponent needs a power-of-two scale rule {POW2_RULES}")
        emax = math.frexp(self.element_max)[1] - 1
        object.__setattr__(self, "_emax", emax)

    @property
    def element_max(self) -> float:
        """Largest element value: 448 for E4M3, 6 for E2M1, 127/64 for MX INT8."""
        return math.ldexp(float(self.element.max), self.element_exponent)

    @property
    def element_emax(self) -> int:
        """Exponent of the largest power of two <= :attr:`element_max` (the OCP ``emax_elem``)."""
        return self._emax

    @property
    def pow2_scales(self) -> bool:
        """Whether the scales are powers of two (a rule of :data:`POW2_RULES`)."""
        return self.scale_rule in POW2_RULES

    @property
    def scale_bound(self) -> float:
        """NVFP4's ``tensor_scale_bound`` in effect (448; 256 under the 4/6 rules by default)."""
        if self.tensor_scale_bound is not None:
            return self.tensor_scale_bound
        return 256.0 if self.scale_rule.startswith("4over6") else float(self.scale.max)

    @property
    def block_size(self) -> int:
        """Elements per block (128 * 128 for a 128x128 tile)."""
        return math.prod(self.block_shape)

    @property
    def bits_per_element(self) -> float:
        """Storage per element, the block's share of its scale included (not the tensor scale)."""
        return self.element.bits + self.scale.bits / self.block_size

    @property
    def packed(self) -> bool:
        """Whether element codes are packed two per byte (4-bit elements)."""
        return self.element.bits == 4

    def __str__(self) -> str:
        return self.name


def _float(name: str) -> FloatFormat:
    f = get_format(name)
    assert isinstance(f, FloatFormat)
    return f


def _mx(name: str, elem: str, **kw: Any) -> BlockFormat:
    return BlockFormat(name, get_format(elem), _float("e8m0"), (32,), "floor", **kw)


#: The named block formats. MX formats use the OCP floor rule; ``get_block_format(name,
#: scale_rule="ceil")`` gives the round-up variant.
BLOCK_FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        _mx("mxfp8_e4m3", "e4m3"),
        _mx("mxfp8_e5m2", "e5m2"),
        _mx("mxfp6_e2m3", "e2m3"),
        _mx("mxfp6_e3m2", "e3m2"),
        _mx("mxfp4_e2m1", "e2m1"),
        _mx("mxint8", "int8", element_exponent=-6),
        BlockFormat("nvfp4", _float("e2m1"), _float("e4m3"), (16,), "amax", tensor_scale=True),
        BlockFormat(
            "nvfp4_16x16", _float("e2m1"), _float("e4m3"), (16, 16), "amax", tensor_scale=True
        ),
        BlockFormat(
            "nvfp4_4over6", _float("e2m1"), _float("e4m3"), (16,), "4over6_mse", tensor_scale=True
        ),
        # the two other block shapes the matrix cores take (gemm.tensor_core: sm_100
        # kind::mxf4nvf4 takes E8M0 scales on blocks of 16, sm_120 UE4M3 on blocks of 32)
        BlockFormat("mxfp4_e2m1_b16", _float("e2m1"), _float("e8m0"), (16,), "floor"),
        BlockFormat("nvfp4_b32", _float("e2m1"), _float("e4m3"), (32,), "amax", tensor_scale=True),
        BlockFormat("fp8_1x128", _float("e4m3"), _float("fp32"), (128,), "amax"),
        BlockFormat("fp8_128x128", _float("e4m3"), _float("fp32"), (128, 128), "amax"),
    )
}


def known_block_formats() -> list[str]:
    """Names accepted by :func:`get_block_format`."""
    return list(BLOCK_FORMATS)


def get_block_format(
    block_format: str | BlockFormat, *, scale_rule: str | None = None
) -> BlockFormat:
    """Look a block format up by name (or pass one through), optionally with another scale rule.

    >>> get_block_format("mxfp8_e4m3", scale_rule="ceil").scale_rule
    'ceil'
    >>> get_block_format("mxfp9")
    Traceback (most recent call last):
    ...
    ValueError: unknown block format 'mxfp9'; known block formats: mxfp8_e4m3, mxfp8_e5m2, ...
    """
    if isinstance(block_format, BlockFormat):
        bf = block_format
    elif isinstance(block_format, str):
        key = block_format.strip().lower()
        if key not in BLOCK_FORMATS:
            names = ", ".join(BLOCK_FORMATS)
            raise ValueError(f"unknown block format {block_format!r}; known block formats: {names}")
        bf = BLOCK_FORMATS[key]
    else:
        raise TypeError(
            f"block_format must be a name or a BlockFormat, got {type(block_format).__name__}"
        )
    if scale_rule is not None and scale_rule != bf.scale_rule:
        if scale_rule not in SCALE_RULES:
            raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")
        bf = replace(bf, scale_rule=scale_rule, name=f"{bf.name}[{scale_rule}]")
    return bf
