"""Low-precision training recipes as data: what each GEMM of a linear layer quantizes, and how.

A linear layer ``y = x @ w.T`` (``x``: activations ``(M, K)``, ``w``: weights ``(N, K)``,
``dy``: output gradients ``(M, N)``) runs three GEMMs, each a *role*:

* ``forward``: ``y = x @ w.T`` (operands ``x`` and ``w``, contraction over K);
* ``dgrad``: ``dx = dy @ w`` (operands ``dy`` and ``w``, contraction over N);
* ``wgrad``: ``dw = dy.T @ x`` (operands ``dy`` and ``x``, contraction over M).

A :class:`Recipe` says per role, for each operand (an :class:`Operand`), the format (a block
format of :data:`~precision_lab.quant.block_formats.BLOCK_FORMATS`, blocks along the contraction
axis, or an element format such as ``"bf16"`` for an operand cast per element), its rounding
(``"nearest_even"`` or ``"stochastic"``) and whether a random Hadamard rotation of a given size
is applied along the contraction axis first (both operands of a role alike, so the product is
unchanged in exact arithmetic). :data:`RECIPES` holds the published ones; each entry names its
source. :func:`precision_lab.gemm.apply_recipe` runs them (one role:
:func:`precision_lab.recipe_gemm`; in a torch model: :func:`precision_lab.torch.simulate`).

>>> r = get_recipe("te_nvfp4")
>>> r.wgrad.a.format, r.wgrad.a.rounding, r.wgrad.a.hadamard
('nvfp4', 'stochastic', 16)
>>> r.forward.b.format
'nvfp4_16x16'
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..core.formats import get_format
from ..core.rounding import check_rounding, is_stochastic, round_to
from .block_formats import BLOCK_FORMATS, get_block_format
from .blocks import QuantizedBlocks, quantize_blocks
from .fine_grained import FINE_GRAINED_FORMATS
from .hadamard import _check_block, _rotation32

__all__ = [
    "RECIPES",
    "ROLES",
    "SCALE_ORDERS",
    "GemmRole",
    "Operand",
    "Recipe",
    "get_recipe",
    "quantize_operand",
    "with_rounding",
]

#: the three GEMMs of a linear layer, and their operand names
ROLES = {"forward": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}


@dataclass(frozen=True)
class Operand:
    """How one GEMM operand is quantized.

    Parameters
    ----------
    format:
        A block format name (``"nvfp4"``, ``"nvfp4_16x16"``, ``"mxfp8_e4m3"``, ``"fp8_1x128"``
        ...; a ``[rule]`` suffix as in ``"mxfp8_e4m3[rceil]"`` picks another scale rule), a
        peer's fine-grained FP8 quantizer of
        :data:`~precision_lab.quant.fine_grained.FINE_GRAINED_FORMATS` (``"deepgemm_1x128"``,
        ``"te_block_128x128"`` ...: DeepGEMM's or Transformer Engine's arithmetic, bit for bit;
        round to nearest only) or an element format (``"bf16"``, ``"fp32"``, ``"e4m3"``: each
        value rounded on its own).
    rounding:
        ``"nearest_even"`` or ``"stochastic"`` (any mode of :func:`~precision_lab.round_to`).
    hadamard:
        Size of the random Hadamard rotation along the contraction axis (None: none; else a
        power of two from 2 to 4096, as :func:`~precision_lab.hadamard` takes).
    """

    format: str
    rounding: str = "nearest_even"
    hadamard: int | None = None

    def __post_init__(self) -> None:
        check_rounding(self.rounding)
        _resolve(self.format)
        if self.hadamard is not None:
            _check_block(self.hadamard, "hadamard")
        if self.fine_grained and check_rounding(self.rounding) != "nearest_even":
            raise ValueError(
                f"{self.format} is a peer's quantizer (round to nearest even), got "
                f"rounding={self.rounding!r}"
            )

    @property
    def blocked(self) -> bool:
        """Whether the format is block-scaled."""
        return self.format.split("[")[0] in BLOCK_FORMATS or self.fine_grained

    @property
    def fine_grained(self) -> bool:
        """Whether the format is a peer's fine-grained quantizer
        (:data:`~precision_lab.quant.fine_grained.FINE_GRAINED_FORMATS`)."""
        return self.format in FINE_GRAINED_FORMATS


#: where a fine-grained FP8 GEMM applies the tile scales (:mod:`precision_lab.gemm.blockwise`)
SCALE_ORDERS = ("cublas", "cutlass", "deepgemm")


@dataclass(frozen=True)
class GemmRole:
    """The two operands of one GEMM (``a @ b``: ``a`` is the first operand named in
    :data:`ROLES`), and the GPU whose tensor-core model accumulates it (None: FP32 promotion per
    block of K, as DeepSeek-V3 and the block-scaled MMA do). ``scale_order`` (fine-grained FP8
    operands): the GEMM runs tile by tile as :func:`precision_lab.gemm.blockwise.blockwise_gemm`,
    the GPU's partial per 128-wide K tile and the scales in cuBLAS's (``"cublas"``) or
    CUTLASS's (``"cutlass"``) or DeepGEMM's (``"deepgemm"``) order."""

    a: Operand
    b: Operand
    gpu: str | None = None
    scale_order: str | None = None

    def __post_init__(self) -> None:
        if self.scale_order is not None:
            if self.scale_order not in SCALE_ORDERS:
                raise ValueError(
                    f"scale_order must be None or one of {SCALE_ORDERS}, got {self.scale_order!r}"
                )
            if not (self.a.blocked and self.b.blocked):
                raise ValueError("scale_order needs block-scaled operands (1x128 / 128x128 tiles)")


@dataclass(frozen=True)
class Recipe:
    """A training recipe: the three roles, and where it is published.

    ``attention``: where attention casts, as the name of an attention recipe of
    :mod:`precision_lab.torch.attention` (``"fa3_fp8"``: Q, K, V and P in FP8 as FlashAttention-3
    runs them); None keeps attention's two GEMMs under the recipe's ``forward`` role.
    :func:`precision_lab.torch.simulate` applies it to ``scaled_dot_product_attention`` and
    ``multi_head_attention_forward`` alike (its own ``attention=`` overrides it).

    >>> import dataclasses
    >>> dataclasses.replace(RECIPES["te_mxfp8"], attention="fa3_fp8").attention
    'fa3_fp8'
    """

    name: str
    forward: GemmRole
    dgrad: GemmRole
    wgrad: GemmRole
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    attention: str | None = None

    def role(self, name: str) -> GemmRole:
        """The :class:`GemmRole` called ``name`` (a key of :data:`ROLES`)."""
        if name not in ROLES:
            raise ValueError(f"role must be one of {tuple(ROLES)}, got {name!r}")
        r: GemmRole = getattr(self, name)
        return r


def _resolve(fmt: str) -> Any:
    """A block format (``name`` or ``name[rule]``) or an element format."""
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a format name, got {type(fmt).__name__}")
    base, _, rule = fmt.partition("[")
    if base in BLOCK_FORMATS:
        return get_block_format(base, scale_rule=rule.rstrip("]") or None)
    if fmt in FINE_GRAINED_FORMATS:
        return FINE_GRAINED_FORMATS[fmt]
    if rule:
        raise ValueError(f"a scale rule suffix needs a block format, got {fmt!r}")
    return get_format(fmt, name="format")


def _role(a: Operand, b: Operand, gpu: str | None = None, order: str | None = None) -> GemmRole:
    return GemmRole(a, b, gpu, order)


_RTN, _SR = "nearest_even", "stochastic"
#: the GPU and scale order of the fine-grained FP8 recipes
_H100_CUBLAS = ("h100", "cublas")

#: The published recipes. Sources: NVIDIA, "Pretraining Large Language Models with NVFP4"
#: (arXiv 2509.25149) and Transformer Engine's recipes (``NVFP4BlockScaling``,
#: ``MXFP8BlockScaling``, ``Float8BlockScaling``); DeepSeek-V3 technical report (arXiv
#: 2412.19437, section 3.3); Quartet (Castro et al., arXiv 2505.14669); "FP4 all the way"
#: (Chmiel et al., arXiv 2505.19115).
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "te_nvfp4",
            forward=_role(Operand("nvfp4"), Operand("nvfp4_16x16")),
            dgrad=_role(Operand("nvfp4", _SR), Operand("nvfp4_16x16")),
            wgrad=_role(Operand("nvfp4", _SR, 16), Operand("nvfp4", _RTN, 16)),
            source="arXiv 2509.25149; Transformer Engine NVFP4BlockScaling",
            notes=(
                "1x16 blocks with E4M3 scales and a 448*6 per-tensor scale; weights in 16x16 "
                "tiles (the same quantized weight serves forward and dgrad)",
                "gradients stochastically rounded; 16-point random Hadamard on both wgrad inputs",
            ),
        ),
        Recipe(
            "te_mxfp8",
            forward=_role(Operand("mxfp8_e4m3[rceil]"), Operand("mxfp8_e4m3[rceil]")),
            dgrad=_role(Operand("mxfp8_e4m3[rceil]"), Operand("mxfp8_e4m3[rceil]")),
            wgrad=_role(Operand("mxfp8_e4m3[rceil]"), Operand("mxfp8_e4m3[rceil]")),
            source="Transformer Engine MXFP8BlockScaling (E4M3 everywhere, scales rounded up)",
            notes=("1x32 blocks along the contraction axis, E8M0 scales by RCEIL",),
        ),
        Recipe(
            "te_fp8_block",
            forward=_role(Operand("te_block_1x128"), Operand("te_block_128x128"), *_H100_CUBLAS),
            dgrad=_role(Operand("te_block_1x128"), Operand("te_block_128x128"), *_H100_CUBLAS),
            wgrad=_role(Operand("te_block_1x128"), Operand("te_block_1x128"), *_H100_CUBLAS),
            source="Transformer Engine Float8BlockScaling (transformer_engine/common/recipe; its "
            "quantizer and GEMM references in tests/pytorch/references)",
            notes=(
                "x and dy in 1x128 tiles (x_block_scaling_dim = grad_block_scaling_dim = 1), w in "
                "128x128 tiles (w_block_scaling_dim = 2); wgrad takes the 1x128 column-wise "
                "quantizations of dy and x; E4M3; power-of-two scales (power_2_scale, "
                "amax_epsilon 0) by TE's quantizer",
                "H100 FP8 wgmma partial per 128-wide K tile (use_split_accumulator=True in every "
                "role), scales applied by cuBLAS's equations",
            ),
        ),
        Recipe(
            "deepseek_v3_fp8",
            forward=_role(Operand("deepgemm_1x128"), Operand("deepgemm_128x128"), *_H100_CUBLAS),
            dgrad=_role(Operand("deepgemm_1x128"), Operand("deepgemm_128x128"), *_H100_CUBLAS),
            wgrad=_role(Operand("deepgemm_1x128"), Operand("deepgemm_1x128"), *_H100_CUBLAS),
            source="DeepSeek-V3, arXiv 2412.19437 section 3.3; DeepGEMM deep_gemm/utils/math.py "
            "(per_token_cast_to_fp8, per_block_cast_to_fp8, ceil_to_ue8m0)",
            notes=(
                "E4M3 for every GEMM input; activations and gradients in 1x128 tiles, weights in "
                "128x128 tiles; UE8M0 scales rounded up by DeepGEMM's cast (amax clamped at 1e-4)",
                "H100 FP8 wgmma partial per 128-wide K tile, promoted into FP32 with cuBLAS's "
                "scale equations (equal to DeepGEMM's order for power-of-two scales)",
            ),
        ),
        Recipe(
            "deepseek_v3",
            forward=_role(Operand("fp8_1x128"), Operand("fp8_128x128")),
            dgrad=_role(Operand("fp8_1x128"), Operand("fp8_128x128")),
            wgrad=_role(Operand("fp8_1x128"), Operand("fp8_1x128")),
            source="DeepSeek-V3, arXiv 2412.19437 section 3.3",
            notes=(
                "E4M3 for every GEMM input; 1x128 tiles for activations and gradients, 128x128 "
                "blocks for weights; partial sums promoted to FP32 every 128 elements of K",
            ),
        ),
        Recipe(
            "quartet",
            forward=_role(Operand("mxfp4_e2m1", _RTN, 32), Operand("mxfp4_e2m1", _RTN, 32)),
            dgrad=_role(Operand("mxfp4_e2m1", _SR, 32), Operand("mxfp4_e2m1", _SR, 32)),
            wgrad=_role(Operand("mxfp4_e2m1", _SR, 32), Operand("mxfp4_e2m1", _SR, 32)),
            source="Quartet, arXiv 2505.14669",
            notes=(
                "MXFP4 everywhere with a 32-point Hadamard along the contraction; forward round "
                "to nearest (the paper's QuEST clipping is not modelled), backward stochastic",
            ),
        ),
        Recipe(
            "fp4_all_the_way",
            forward=_role(Operand("nvfp4"), Operand("nvfp4")),
            dgrad=_role(Operand("nvfp4", _SR), Operand("nvfp4")),
            wgrad=_role(Operand("nvfp4", _SR), Operand("nvfp4", _SR)),
            source='"FP4 all the way", arXiv 2505.19115',
            notes=("NVFP4 (blocks of 16, E4M3 scales): round to nearest forward, SR backward",),
        ),
        Recipe(
            "bf16",
            forward=_role(Operand("bf16"), Operand("bf16")),
            dgrad=_role(Operand("bf16"), Operand("bf16")),
            wgrad=_role(Operand("bf16"), Operand("bf16")),
            source="the usual mixed-precision baseline",
        ),
        Recipe(
            "fp32",
            forward=_role(Operand("fp32"), Operand("fp32")),
            dgrad=_role(Operand("fp32"), Operand("fp32")),
            wgrad=_role(Operand("fp32"), Operand("fp32")),
            source="full precision reference",
        ),
    )
}


def get_recipe(recipe: str | Recipe) -> Recipe:
    """A recipe of :data:`RECIPES` by name (or a :class:`Recipe`, passed through).

    >>> get_recipe("deepseek_v3").forward.b.format
    'fp8_128x128'
    """
    if isinstance(recipe, Recipe):
        return recipe
    if not isinstance(recipe, str) or recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; known recipes: {', '.join(RECIPES)}")
    return RECIPES[recipe]


def quantize_operand(
    x: Any, operand: Operand, *, axis: int, seed: int = 0, hadamard_seed: int | None = None
) -> QuantizedBlocks | np.ndarray:
    """One GEMM operand as the recipe quantizes it, blocks along the contraction ``axis``.

    The optional random Hadamard rotation (signs of ``hadamard_seed``, default ``seed``; exact
    arithmetic, float32 result) comes first, along ``axis``, which is zero-padded to a multiple
    of the rotation's size (the result is then longer along ``axis``; rotate the other operand
    of the GEMM alike and the padding adds nothing to the product); then a block format gives
    :class:`QuantizedBlocks` (``pad=True`` where the axis is not a multiple of the block;
    ``keep_values=True``: the GEMMs read the element values, the codes are encoded if read), an
    element format the rounded values (float32 or float64). Stochastic rounding uses ``seed`` too.

    >>> import numpy as np
    >>> q = quantize_operand(np.ones((2, 32)), Operand("mxfp8_e4m3"), axis=-1)
    >>> q.scales.shape
    (2, 1)
    """
    a = np.asarray(x)
    if operand.hadamard is not None:  # (zero-padded, exact, float32)
        hs = seed if hadamard_seed is None else hadamard_seed
        a = _rotation32(a, operand.hadamard, axis, hs)
    fmt = _resolve(operand.format)
    if operand.fine_grained:
        return fmt.quantize(a, axis=axis)  # type: ignore[no-any-return]
    sr_seed = seed if is_stochastic(operand.rounding) else None
    if operand.blocked:
        return quantize_blocks(a, fmt, axis=axis, rounding=operand.rounding, seed=sr_seed, pad=True,
                               keep_values=True)  # (codes encoded if read)  # fmt: skip
    return round_to(a, fmt, rounding=operand.rounding, seed=sr_seed)


def with_rounding(recipe: Recipe, **roles: str) -> Recipe:
    """A copy of ``recipe`` with the rounding of every operand of the named roles replaced
    (``with_rounding(r, dgrad="nearest_even")``)."""
    new: dict[str, Any] = {}
    for name, mode in roles.items():
        role = recipe.role(name)
        new[name] = replace(
            role, a=replace(role.a, rounding=mode), b=replace(role.b, rounding=mode)
        )
    return replace(recipe, **new)
