"""Precision policies: which format each part of a training step uses, as data.

A :class:`Policy` says, the way Keras mixed-precision policies and PyTorch autocast do, in which
number format the parts of a training step run:

* ``compute_format``: the inputs of the forward GEMMs (weights are cast to it each step);
* ``backward_format``: the gradient operand of the backward GEMMs (FP8 "hybrid": E5M2);
* ``activation_format`` and ``gradient_format``: the storage formats of activations and
  gradients;
* ``variable_format``: the master weights and the optimizer update (Keras' variable dtype);
* ``accumulator``: the :class:`~precision_lab.Accumulator` of every GEMM (``None``: fp32 sums
  done by BLAS);
* ``loss_scaling``: a :class:`LossScaleSpec` (none, static, or a dynamic scaler preset of
  :mod:`precision_lab.scaling`);
* ``tensor_scaling``: a :class:`TensorScaleSpec`, the per-tensor scaling of 8-bit GEMM operands
  (Transformer Engine's delayed scaling, or current scaling);
* ``fp32_ops``: the autocast-like rule list, operations that run in FP32 whatever the compute
  format (see :data:`FP32_OPS`);
* ``overrides``: :class:`LayerOverride` entries, per-layer formats (e.g. the first and last
  layers in BF16 under FP8, as Transformer Engine recipes keep them).

Named policies (:data:`POLICIES`, :func:`get_policy`): ``float32``, ``mixed_float16`` and
``mixed_bfloat16`` (Keras' names: compute in FP16/BF16, variables in FP32; ``mixed_float16``
with Keras' dynamic loss scaling, ``LossScaleOptimizer`` defaults) and ``fp8_hybrid``
(Transformer Engine's ``Format.HYBRID`` recipe: E4M3 forward, E5M2 gradients, delayed scaling
with TE's defaults, amax history 1024, ``max``, margin 0; activations and gradients in BF16
around the FP8 GEMMs). Keras leaves it to the user to make the output softmax ``float32``; here
every named policy carries the rule list, as autocast does.

Policies are data: :meth:`Policy.to_dict` / :meth:`Policy.from_dict` and
:meth:`Policy.to_json` / :meth:`Policy.from_json` round-trip them exactly; unknown names,
unknown fields and invalid combinations raise ``ValueError`` (``TypeError`` for wrong types)
naming the field. :meth:`~precision_lab.training.TrainConfig.from_policy` turns a policy into a
run of the training emulation.

>>> p = get_policy("mixed_float16")
>>> p.compute_format, p.variable_format, p.loss_scaling.kind, p.runs_in_fp32("softmax")
('fp16', 'fp32', 'dynamic', True)
>>> Policy.from_json(p.to_json()) == p
True
>>> p.without_fp32("softmax", "cross_entropy").fp32_ops
('norm_statistics', 'reductions')
>>> get_policy("mixed_float32")
Traceback (most recent call last):
...
ValueError: policy: unknown name 'mixed_float32'; known: float32, mixed_float16, ...
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.formats import FORMATS, FloatFormat, get_format
from ..gemm import Accumulator
from ..scaling import PRESETS, DynamicLossScaler, StaticLossScaler

__all__ = [
    "FP32_OPS",
    "KNOWN_OPS",
    "POLICIES",
    "LayerOverride",
    "LayerPrecision",
    "LossScaleSpec",
    "Policy",
    "TensorScaleSpec",
    "get_policy",
]

#: Operations the rule list can name, and what running them "in FP32" means.
KNOWN_OPS: dict[str, str] = {
    "softmax": "the output head: the logits are kept in FP32 (the last GEMM's FP32 accumulator "
    "output is not rounded to the activation format) and the softmax runs in FP32",
    "cross_entropy": "the loss and its gradient (softmax - onehot) * scale / batch in FP32, "
    "stored afterwards in the gradient format",
    "norm_statistics": "normalisation statistics (mean, variance, 1/sqrt(var + eps)) and the "
    "normalisation's own arithmetic in FP32",
    "reductions": "sums over a batch or a feature axis (bias gradients, the statistics' sums, "
    "the loss mean) accumulate in FP32; otherwise in the compute format (pairwise)",
}

#: The default rule list (autocast's fp32 list, restricted to the operations of this model).
FP32_OPS: tuple[str, ...] = ("softmax", "cross_entropy", "norm_statistics", "reductions")

_LOSS_KINDS = ("none", "static", "dynamic")
_TENSOR_KINDS = ("none", "delayed", "current")
_FORMAT_FIELDS = (
    "compute_format",
    "backward_format",
    "activation_format",
    "gradient_format",
    "variable_format",
)


# ----- formats as data -------------------------------------------------------------------------
def _format(value: Any, where: str) -> FloatFormat:
    """A floating-point format from a name or a FloatFormat; errors name ``where``."""
    if not isinstance(value, str | FloatFormat):
        raise TypeError(f"{where}: expected a format name or a FloatFormat, got {value!r}")
    try:
        f = get_format(value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if not isinstance(f, FloatFormat):
        raise ValueError(
            f"{where}: must be a floating-point format, got {f}; integer formats (INT8) are "
            "reached after training by precision_lab.training.ptq or precision_lab.training.qat"
        )
    return f


def _format_name(value: Any, where: str) -> str | FloatFormat:
    """The registry name of a format (canonical), or the FloatFormat itself when unnamed."""
    f = _format(value, where)
    if f.name is not None and FORMATS.get(f.name) == f:
        return f.name
    return f


def _format_to_data(f: Any) -> Any:
    if isinstance(f, FloatFormat):
        if f.name is not None and FORMATS.get(f.name) == f:
            return f.name
        return {k.name: getattr(f, k.name) for k in dataclasses.fields(f) if k.name != "name"}
    return f


def _format_from_data(d: Any, where: str) -> Any:
    if isinstance(d, dict):
        try:
            return FloatFormat(**d)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: not a FloatFormat: {e}") from None
    return d


def _strict_keys(d: Any, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise TypeError(f"{where}: expected a dict, got {type(d).__name__}")
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {', '.join(allowed)}")
    return dict(d)


def accumulator_to_dict(acc: Accumulator) -> dict[str, Any]:
    """The fields of an :class:`~precision_lab.Accumulator` that differ from the defaults,
    formats by name (unnamed formats as dicts of their parameters).

    >>> accumulator_to_dict(Accumulator("bf16", promote_every=128))
    {'format': 'bf16', 'promote_every': 128}
    """
    default = Accumulator()
    out: dict[str, Any] = {}
    for f in dataclasses.fields(acc):
        v = getattr(acc, f.name)
        if f.name == "name" and v is None:
            continue
        if f.name != "name" and v == getattr(default, f.name):
            continue
        out[f.name] = accumulator_to_dict(v) if isinstance(v, Accumulator) else _format_to_data(v)
    return out


def accumulator_from_dict(d: Any) -> Accumulator:
    """The inverse of :func:`accumulator_to_dict`."""
    names = tuple(f.name for f in dataclasses.fields(Accumulator))
    d = _strict_keys(d, names, "accumulator")
    for k in ("format", "promote_format", "product_format"):
        if k in d:
            d[k] = _format_from_data(d[k], f"accumulator.{k}")
    if d.get("long_kernel") is not None:
        d["long_kernel"] = accumulator_from_dict(d["long_kernel"])
    try:
        return Accumulator(**d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"accumulator: {e}") from None


# ----- the parts of a policy -------------------------------------------------------------------
@dataclass(frozen=True)
class LossScaleSpec:
    """Loss scaling of a policy: ``kind`` ``"none"``, ``"static"`` (``init_scale``) or
    ``"dynamic"`` (a :class:`~precision_lab.scaling.DynamicLossScaler` preset, ``init_scale``
    and extra ``options``; ``init_scale=None`` takes the preset's)."""

    kind: Literal["none", "static", "dynamic"] = "none"
    init_scale: float | None = None
    preset: str = "torch"
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _LOSS_KINDS:
            raise ValueError(
                f"loss_scaling.kind: expected one of {', '.join(_LOSS_KINDS)}, got {self.kind!r}"
            )
        opts = self.options
        if isinstance(opts, dict):
            opts = tuple(sorted(opts.items()))
        if not isinstance(opts, tuple | list) or any(
            not (isinstance(o, tuple | list) and len(o) == 2 and isinstance(o[0], str))
            for o in opts
        ):
            raise TypeError(f"loss_scaling.options: expected (name, value) pairs, got {opts!r}")
        object.__setattr__(self, "options", tuple((str(k), v) for k, v in opts))
        s = self.init_scale
        if s is not None:
            if isinstance(s, bool) or not isinstance(s, int | float):
                raise TypeError(f"loss_scaling.init_scale: expected a number, got {s!r}")
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"loss_scaling.init_scale: expected a finite scale > 0, got {s!r}")
            object.__setattr__(self, "init_scale", float(s))
        if self.kind == "none":
            if s not in (None, 1.0) or self.options:
                raise ValueError(
                    f"loss_scaling: kind='none' takes no init_scale or options, got "
                    f"init_scale={s!r}, options={self.options!r}"
                )
        elif self.kind == "static":
            if s is None:
                raise ValueError("loss_scaling.init_scale: kind='static' needs a scale")
            if self.options:
                raise ValueError(f"loss_scaling.options: kind='static' takes none, got {opts!r}")
        else:
            if self.preset not in PRESETS:
                raise ValueError(
                    f"loss_scaling.preset: unknown preset {self.preset!r}; known: "
                    f"{', '.join(PRESETS)}"
                )
            try:
                self.make()
            except (TypeError, ValueError) as e:
                raise ValueError(f"loss_scaling.options: {e}") from None

    @property
    def scale(self) -> float:
        """The initial loss scale."""
        if self.kind == "none":
            return 1.0
        if self.init_scale is None:
            return float(PRESETS[self.preset]["init_scale"])
        return self.init_scale

    def make(self) -> Any:
        """A fresh scaler (:class:`~precision_lab.scaling.LossScaler`)."""
        if self.kind == "dynamic":
            kw = dict(self.options)
            if self.init_scale is not None:
                kw["init_scale"] = self.init_scale
            return DynamicLossScaler.preset(self.preset, **kw)
        return StaticLossScaler(self.scale)


@dataclass(frozen=True)
class TensorScaleSpec:
    """Per-tensor scaling of the 8-bit GEMM operands: ``kind`` ``"none"``, ``"delayed"``
    (Transformer Engine's :class:`~precision_lab.scaling.DelayedScaling`, ``amax_history_len``,
    ``margin``, amax algorithm ``max``) or ``"current"`` (the operand's own amax)."""

    kind: Literal["none", "delayed", "current"] = "none"
    amax_history_len: int = 1024
    margin: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _TENSOR_KINDS:
            raise ValueError(
                f"tensor_scaling.kind: expected one of {', '.join(_TENSOR_KINDS)}, "
                f"got {self.kind!r}"
            )
        n = self.amax_history_len
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"tensor_scaling.amax_history_len: expected an int >= 1, got {n!r}")
        m = self.margin
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"tensor_scaling.margin: expected an int >= 0, got {m!r}")


@dataclass(frozen=True)
class LayerOverride:
    """Formats of one layer that differ from the policy's (``None``: the policy's).

    ``layer`` is the index of a GEMM layer, from the input; negative indices count from the
    output (``-1`` is the output layer)."""

    layer: int
    compute_format: str | FloatFormat | None = None
    backward_format: str | FloatFormat | None = None
    activation_format: str | FloatFormat | None = None
    gradient_format: str | FloatFormat | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, int):
            raise TypeError(f"overrides.layer: expected an int, got {self.layer!r}")
        for name in _FORMAT_FIELDS[:4]:
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(
                    self, name, _format_name(v, f"overrides[layer={self.layer}].{name}")
                )
        if all(getattr(self, n) is None for n in _FORMAT_FIELDS[:4]):
            raise ValueError(f"overrides[layer={self.layer}]: sets no format")


@dataclass(frozen=True)
class LayerPrecision:
    """The resolved formats of one layer (see :meth:`Policy.layer`)."""

    compute: FloatFormat
    backward: FloatFormat
    activation: FloatFormat
    gradient: FloatFormat

    @property
    def scaled(self) -> bool:
        """Whether the layer's GEMM operands are 8-bit (and so per-tensor scaled)."""
        return self.compute.bits <= 8 or self.backward.bits <= 8


# ----- the policy ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """A precision policy (see the module docstring). Format fields take names (aliases are
    normalised to the registry's name) or :class:`~precision_lab.FloatFormat`;
    ``backward_format``, ``activation_format`` and ``gradient_format`` default to
    ``compute_format``.

    Invalid combinations (ValueError naming the field): an 8-bit compute or backward format
    without per-tensor scaling; per-tensor scaling with no 8-bit format to scale; master weights
    (``variable_format``) narrower than 16 bits or less precise than the compute format; rule
    names not in :data:`KNOWN_OPS`; two overrides of one layer.

    >>> Policy("pure_bf16", compute_format="bfloat16", variable_format="bf16").gradient_format
    'bf16'
    >>> Policy("x", compute_format="e4m3")
    Traceback (most recent call last):
    ...
    ValueError: compute_format: the 8-bit format e4m3 needs per-tensor scaling: ...
    """

    name: str
    compute_format: str | FloatFormat = "fp32"
    backward_format: str | FloatFormat | None = None
    activation_format: str | FloatFormat | None = None
    gradient_format: str | FloatFormat | None = None
    variable_format: str | FloatFormat = "fp32"
    accumulator: Accumulator | None = None
    loss_scaling: LossScaleSpec = field(default_factory=LossScaleSpec)
    tensor_scaling: TensorScaleSpec = field(default_factory=TensorScaleSpec)
    fp32_ops: tuple[str, ...] = FP32_OPS
    overrides: tuple[LayerOverride, ...] = ()

    def __post_init__(self) -> None:
        put = object.__setattr__
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        put(self, "compute_format", _format_name(self.compute_format, "compute_format"))
        for name in ("backward_format", "activation_format", "gradient_format"):
            v = getattr(self, name)
            put(self, name, self.compute_format if v is None else _format_name(v, name))
        put(self, "variable_format", _format_name(self.variable_format, "variable_format"))
        if self.accumulator is not None and not isinstance(self.accumulator, Accumulator):
            raise TypeError(
                f"accumulator: expected a precision_lab.Accumulator or None, got "
                f"{self.accumulator!r}"
            )
        if isinstance(self.loss_scaling, str):
            put(self, "loss_scaling", LossScaleSpec(self.loss_scaling))  # type: ignore[arg-type]
        if not isinstance(self.loss_scaling, LossScaleSpec):
            raise TypeError(f"loss_scaling: expected a LossScaleSpec, got {self.loss_scaling!r}")
        if isinstance(self.tensor_scaling, str):
            put(self, "tensor_scaling", TensorScaleSpec(self.tensor_scaling))  # type: ignore[arg-type]
        if not isinstance(self.tensor_scaling, TensorScaleSpec):
            raise TypeError(
                f"tensor_scaling: expected a TensorScaleSpec, got {self.tensor_scaling!r}"
            )
        self._check_ops()
        self._check_overrides()
        self._check_combinations()

    def _check_ops(self) -> None:
        ops = self.fp32_ops
        if isinstance(ops, str) or not isinstance(ops, tuple | list):
            raise TypeError(f"fp32_ops: expected a tuple of operation names, got {ops!r}")
        for op in ops:
            if op not in KNOWN_OPS:
                raise ValueError(
                    f"fp32_ops: unknown operation {op!r}; known: {', '.join(KNOWN_OPS)}"
                )
        if len(set(ops)) != len(ops):
            raise ValueError(f"fp32_ops: names repeat in {tuple(ops)}")
        object.__setattr__(self, "fp32_ops", tuple(ops))

    def _check_overrides(self) -> None:
        ovs = self.overrides
        if not isinstance(ovs, tuple | list) or any(not isinstance(o, LayerOverride) for o in ovs):
            raise TypeError(f"overrides: expected a tuple of LayerOverride, got {ovs!r}")
        layers = [o.layer for o in ovs]
        dup = sorted({i for i in layers if layers.count(i) > 1})
        if dup:
            raise ValueError(f"overrides: layer(s) {dup} overridden more than once")
        object.__setattr__(self, "overrides", tuple(ovs))

    def _check_combinations(self) -> None:
        var = _format(self.variable_format, "variable_format")
        comp = _format(self.compute_format, "compute_format")
        if var.bits < 16:
            raise ValueError(
                f"variable_format: master weights need at least 16 bits, got {var} "
                f"({var.bits} bits); 8-bit formats are compute formats"
            )
        if var.precision < comp.precision:
            raise ValueError(
                f"variable_format: {var} ({var.precision} significant bits) cannot hold the "
                f"weights of compute_format {comp} ({comp.precision} bits)"
            )
        scaled = self.tensor_scaling.kind != "none"
        groups: list[tuple[int | None, Any, Any]] = [
            (None, self.compute_format, self.backward_format)
        ]
        groups += [(o.layer, o.compute_format, o.backward_format) for o in self.overrides]
        any8 = False
        for layer, c, b in groups:
            for fname, v in (("compute_format", c), ("backward_format", b)):
                if v is None:
                    continue
                f = _format(v, fname)
                if f.bits <= 8:
                    any8 = True
                    if not scaled:
                        where = fname if layer is None else f"overrides[layer={layer}].{fname}"
                        raise ValueError(
                            f"{where}: the 8-bit format {f} needs per-tensor scaling: set "
                            "tensor_scaling=TensorScaleSpec('delayed') or 'current'"
                        )
        if scaled and not any8:
            raise ValueError(
                f"tensor_scaling: kind={self.tensor_scaling.kind!r} scales 8-bit GEMM operands, "
                f"but no compute or backward format is 8-bit (compute {comp})"
            )

    # ----- queries -----------------------------------------------------------------------------
    def runs_in_fp32(self, op: str) -> bool:
        """Whether operation ``op`` (a name of :data:`KNOWN_OPS`) runs in FP32."""
        if op not in KNOWN_OPS:
            raise ValueError(f"op: unknown operation {op!r}; known: {', '.join(KNOWN_OPS)}")
        return op in self.fp32_ops

    def layer(self, index: int, n_layers: int) -> LayerPrecision:
        """The formats of GEMM layer ``index`` of ``n_layers`` (overrides applied).

        >>> p = get_policy("fp8_hybrid").replace(
        ...     overrides=(LayerOverride(0, compute_format="bf16", backward_format="bf16"),))
        >>> p.layer(0, 3).compute.name, p.layer(1, 3).compute.name, p.layer(-1, 3).backward.name
        ('bf16', 'e4m3', 'e5m2')
        """
        if not -n_layers <= index < n_layers:
            raise ValueError(f"index: layer {index} out of range for {n_layers} layers")
        i = index % n_layers
        names = {n: getattr(self, n) for n in _FORMAT_FIELDS[:4]}
        for o in self.overrides:
            if not -n_layers <= o.layer < n_layers:
                raise ValueError(
                    f"overrides: layer {o.layer} out of range for a network of {n_layers} layers"
                )
            if o.layer % n_layers == i:
                names.update({n: getattr(o, n) for n in names if getattr(o, n) is not None})
        return LayerPrecision(
            compute=_format(names["compute_format"], "compute_format"),
            backward=_format(names["backward_format"], "backward_format"),
            activation=_format(names["activation_format"], "activation_format"),
            gradient=_format(names["gradient_format"], "gradient_format"),
        )

    def replace(self, **changes: Any) -> Policy:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def without_fp32(self, *ops: str) -> Policy:
        """The policy with ``ops`` removed from the FP32 rule list (they then run in the
        compute format); the name gets a suffix."""
        for op in ops:
            self.runs_in_fp32(op)  # validates the name
        kept = tuple(o for o in self.fp32_ops if o not in ops)
        return self.replace(name=f"{self.name}-{'-'.join(ops)}_low", fp32_ops=kept)

    def bytes_per_parameter(self, *, optimizer: str = "adam") -> dict[str, float]:
        """Training memory per parameter in bytes: master weight (``variable_format``), the
        working copy in the compute format when it differs, the gradient (``gradient_format``),
        the optimizer state (Adam: two FP32 moments; SGD with momentum: one), and ``total``;
        ``inference``: one weight in the compute format.

        >>> b = get_policy("mixed_float16").bytes_per_parameter()
        >>> b["master"], b["working_copy"], b["gradient"], b["optimizer"], b["total"]
        (4.0, 2.0, 2.0, 8.0, 16.0)
        """
        if optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer: expected 'adam' or 'sgd', got {optimizer!r}")
        var = _format(self.variable_format, "variable_format").bits / 8
        comp = _format(self.compute_format, "compute_format").bits / 8
        grad = _format(self.gradient_format, "gradient_format").bits / 8
        out = {
            "master": var,
            "working_copy": comp if self.compute_format != self.variable_format else 0.0,
            "gradient": grad,
            "optimizer": 8.0 if optimizer == "adam" else 4.0,
        }
        out["total"] = sum(out.values())
        out["inference"] = comp
        return out

    def describe(self) -> str:
        """One line: the formats, the scalers and the rule list."""
        parts = [f"compute {self.compute_format}"]
        if self.backward_format != self.compute_format:
            parts.append(f"backward {self.backward_format}")
        parts.append(f"activations {self.activation_format}, gradients {self.gradient_format}")
        parts.append(f"variables {self.variable_format}")
        acc = self.accumulator
        parts.append("fp32 accumulation" if acc is None else acc.describe())
        ls = self.loss_scaling
        if ls.kind != "none":
            parts.append(f"{ls.kind} loss scaling from 2^{math.log2(ls.scale):g}")
        if self.tensor_scaling.kind != "none":
            parts.append(f"{self.tensor_scaling.kind} per-tensor scaling")
        parts.append("FP32 ops: " + (", ".join(self.fp32_ops) or "none"))
        return f"{self.name}: " + "; ".join(parts)

    # ----- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data (str, numbers, lists, dicts, None): JSON-ready."""
        d: dict[str, Any] = {"name": self.name}
        for n in _FORMAT_FIELDS:
            d[n] = _format_to_data(getattr(self, n))
        d["accumulator"] = (
            None if self.accumulator is None else accumulator_to_dict(self.accumulator)
        )
        ls = self.loss_scaling
        d["loss_scaling"] = {
            "kind": ls.kind,
            "init_scale": ls.init_scale,
            "preset": ls.preset,
            "options": {k: v for k, v in ls.options},
        }
        ts = self.tensor_scaling
        d["tensor_scaling"] = {
            "kind": ts.kind,
            "amax_history_len": ts.amax_history_len,
            "margin": ts.margin,
        }
        d["fp32_ops"] = list(self.fp32_ops)
        d["overrides"] = [
            {"layer": o.layer}
            | {n: _format_to_data(getattr(o, n)) for n in _FORMAT_FIELDS[:4] if getattr(o, n)}
            for o in self.overrides
        ]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Policy:
        """The policy of :meth:`to_dict`'s data; unknown fields raise ValueError."""
        allowed = tuple(f.name for f in dataclasses.fields(cls))
        d = _strict_keys(d, allowed, "policy")
        if "name" not in d:
            raise ValueError("policy: the field 'name' is missing")
        for n in _FORMAT_FIELDS:
            if n in d:
                d[n] = _format_from_data(d[n], n)
        if d.get("accumulator") is not None:
            d["accumulator"] = accumulator_from_dict(d["accumulator"])
        if "loss_scaling" in d:
            ls = _strict_keys(
                d["loss_scaling"], ("kind", "init_scale", "preset", "options"), "loss_scaling"
            )
            if "options" in ls:
                opts = ls["options"]
                if not isinstance(opts, dict):
                    raise TypeError(f"loss_scaling.options: expected a dict, got {opts!r}")
                ls["options"] = tuple(opts.items())
            d["loss_scaling"] = LossScaleSpec(**ls)
        if "tensor_scaling" in d:
            ts = _strict_keys(
                d["tensor_scaling"], ("kind", "amax_history_len", "margin"), "tensor_scaling"
            )
            d["tensor_scaling"] = TensorScaleSpec(**ts)
        if "fp32_ops" in d:
            if not isinstance(d["fp32_ops"], list | tuple):
                raise TypeError(f"fp32_ops: expected a list of names, got {d['fp32_ops']!r}")
            d["fp32_ops"] = tuple(d["fp32_ops"])
        if "overrides" in d:
            ovs = d["overrides"]
            if not isinstance(ovs, list | tuple):
                raise TypeError(f"overrides: expected a list, got {ovs!r}")
            names = ("layer", *_FORMAT_FIELDS[:4])
            items = []
            for o in ovs:
                o = _strict_keys(o, names, "overrides")
                if "layer" not in o:
                    raise ValueError("overrides: an entry has no 'layer'")
                for n in _FORMAT_FIELDS[:4]:
                    if n in o:
                        o[n] = _format_from_data(o[n], f"overrides.{n}")
                items.append(LayerOverride(**o))
            d["overrides"] = tuple(items)
        return cls(**d)

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as JSON (``kwargs`` go to :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> Policy:
        """The policy of :meth:`to_json`'s text."""
        return cls.from_dict(json.loads(text))

    # ----- the training emulation ----------------------------------------------------------------
    def train_fields(self) -> dict[str, Any]:
        """The numeric fields of :class:`~precision_lab.training.TrainConfig` this policy sets
        (formats by name; unnamed formats as FloatFormat)."""
        ls, ts = self.loss_scaling, self.tensor_scaling
        return {
            "forward_format": self.compute_format,
            "backward_format": self.backward_format,
            "activation_format": self.activation_format,
            "gradient_format": self.gradient_format,
            "master_format": self.variable_format,
            "accumulator": self.accumulator,
            "loss_scaling": ls.kind,
            "loss_scale": ls.scale,
            "scaler_preset": ls.preset,
            "scaler_options": ls.options,
            "tensor_scaling": ts.kind,
            "amax_history_len": ts.amax_history_len,
            "fp8_margin": ts.margin,
        }


#: The named policies.
POLICIES: dict[str, Policy] = {
    "float32": Policy("float32"),
    "mixed_float16": Policy(
        "mixed_float16",
        compute_format="fp16",
        loss_scaling=LossScaleSpec("dynamic", preset="keras"),
    ),
    "mixed_bfloat16": Policy("mixed_bfloat16", compute_format="bf16"),
    "fp8_hybrid": Policy(
        "fp8_hybrid",
        compute_format="e4m3",
        backward_format="e5m2",
        activation_format="bf16",
        gradient_format="bf16",
        tensor_scaling=TensorScaleSpec("delayed", amax_history_len=1024, margin=0),
    ),
}


def get_policy(policy: str | Policy) -> Policy:
    """A named policy (:data:`POLICIES`), or ``policy`` itself when it is a :class:`Policy`."""
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"policy: expected a name or a Policy, got {policy!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown name {policy!r}; known: {', '.join(POLICIES)}")
    return POLICIES[policy]
