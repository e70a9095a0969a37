"""Configurations of the emulated mixed-precision training run.

A :class:`TrainConfig` keeps every numeric choice in its own field, so that a higher-level policy
can drive it: the GEMM input formats of the forward and backward passes, the storage formats of
activations and gradients, the master-weight format, the accumulator, the loss scaler and the
per-tensor (FP8) scaling. :data:`RUNS` holds the six runs of the report.

>>> cfg = RUNS["fp16_dynamic"]
>>> cfg.forward_format, cfg.gradient_format, cfg.loss_scaling, cfg.scaler_preset
('fp16', 'fp16', 'dynamic', 'torch')
>>> make_scaler(cfg).scale
65536.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.formats import FloatFormat, get_format
from ..scaling import DynamicLossScaler, LossScaler, StaticLossScaler
from .policy import get_policy

__all__ = ["RUNS", "TrainConfig", "make_scaler"]


@dataclass(frozen=True)
class TrainConfig:
    """One training run: numerics, model and optimisation.

    Numerics
    --------
    forward_format:
        Input format of the forward GEMMs (activations and weights are cast to it).
    backward_format:
        Input format of the gradient operand of the backward GEMMs (dgrad ``dY @ W.T``, wgrad
        ``X.T @ dY``); the other operand stays in ``forward_format`` (FP8 "hybrid": E4M3 forward,
        E5M2 gradients).
    activation_format, gradient_format:
        Storage formats: every layer output (activation) and every gradient (activation
        gradients, weight and bias gradients, before unscaling) is rounded to them.
    master_format:
        Format of the master weights and of the optimizer update (fp32).
    weight_update:
        How the weights are stored and updated (:mod:`precision_lab.training.updates`):
        ``"fp32"`` (master weights in ``master_format``, the default), or weights kept in bf16
        with ``w <- round(w + delta)`` rounded to nearest (``"bf16_rn"``), stochastically
        (``"bf16_sr"``) or Kahan-compensated with a bf16 buffer (``"bf16_kahan"``); the
        optimizer states stay float32 (Zamirai et al. 2020).
    accumulator:
        The :class:`~precision_lab.Accumulator` of every GEMM (through
        :func:`precision_lab.gemm`); ``None`` means fp32 sums by
        :func:`~precision_lab.training.model.matmul_fixed_order` (exact products added in float64
        in a fixed order, rounded once to fp32): fast, and the same bits on every machine.
    loss_scaling:
        ``"none"``, ``"static"`` (``loss_scale``) or ``"dynamic"`` (a
        :class:`~precision_lab.scaling.DynamicLossScaler` preset ``scaler_preset`` with
        ``init_scale=loss_scale`` and the options ``scaler_options``).
    tensor_scaling:
        Per-tensor scaling of GEMM operands before the cast to an FP8 format: ``"none"``,
        ``"delayed"`` (Transformer Engine's :class:`~precision_lab.scaling.DelayedScaling`, one
        per operand, ``amax_history_len``, ``fp8_margin``) or ``"current"``.

    Model and optimisation
    ----------------------
    hidden, init_std:
        Hidden layer widths (ReLU) and the standard deviation of the normal initial weights
        (small, as in large models: 0.002).
    batch_size, epochs:
        Minibatches of ``batch_size`` (the loss is the mean over the batch: a large batch makes
        the per-example gradients small), ``len(train) // batch_size`` steps per epoch.
    optimizer, lr, lr_schedule, momentum, beta2:
        ``"adam"`` (``momentum`` is beta1) or ``"sgd"`` with momentum; the learning rate is
        constant, or a tenth of it for the last quarter of the steps (``"step"``), or a cosine
        decay.
    seed:
        Seeds the split of the data, the initial weights and the batch order.
    record_every:
        Steps between recordings of per-layer gradient statistics.
    policy:
        ``None``, or the :class:`~precision_lab.training.policy.Policy` the numeric fields came from
        (:meth:`from_policy`): the network then honours its FP32 rule list and per-layer
        overrides (:class:`~precision_lab.training.policy_model.PolicyMLP`).
    """

    name: str = "fp32"
    forward_format: str = "fp32"
    backward_format: str = "fp32"
    activation_format: str = "fp32"
    gradient_format: str = "fp32"
    master_format: str = "fp32"
    weight_update: Literal["fp32", "bf16_rn", "bf16_sr", "bf16_kahan"] = "fp32"
    accumulator: Any = None
    loss_scaling: Literal["none", "static", "dynamic"] = "none"
    loss_scale: float = 1.0
    scaler_preset: str = "torch"
    scaler_options: tuple[tuple[str, Any], ...] = ()
    tensor_scaling: Literal["none", "delayed", "current"] = "none"
    amax_history_len: int = 16
    fp8_margin: int = 0
    hidden: tuple[int, ...] = (64, 64, 64)
    init_std: float = 0.002
    batch_size: int = 512
    epochs: int = 40
    optimizer: Literal["sgd", "adam"] = "adam"
    lr_schedule: Literal["constant", "step", "cosine"] = "step"
    lr: float = 0.01
    momentum: float = 0.9
    beta2: float = 0.999
    seed: int = 0
    record_every: int = 10
    policy: Any = None
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in (
            "forward_format",
            "backward_format",
            "activation_format",
            "gradient_format",
            "master_format",
        ):
            f = get_format(getattr(self, name), name=name)
            if not isinstance(f, FloatFormat):
                raise ValueError(f"{name} must be a floating-point format, got {f}")
        if self.loss_scaling not in ("none", "static", "dynamic"):
            raise ValueError(
                f"loss_scaling must be 'none', 'static' or 'dynamic', got {self.loss_scaling!r}"
            )
        if self.weight_update not in ("fp32", "bf16_rn", "bf16_sr", "bf16_kahan"):
            raise ValueError(
                "weight_update must be 'fp32', 'bf16_rn', 'bf16_sr' or 'bf16_kahan', "
                f"got {self.weight_update!r}"
            )
        if self.tensor_scaling not in ("none", "delayed", "current"):
            raise ValueError(
                "tensor_scaling must be 'none', 'delayed' or 'current', "
                f"got {self.tensor_scaling!r}"
            )
        if not (self.loss_scale > 0):
            raise ValueError(f"loss_scale must be > 0, got {self.loss_scale!r}")
        for name in ("batch_size", "epochs", "record_every", "amax_history_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not self.hidden or any(not isinstance(h, int) or h < 1 for h in self.hidden):
            raise ValueError(
                f"hidden must be a non-empty tuple of positive ints, got {self.hidden}"
            )
        if not (self.lr > 0 and 0 <= self.momentum < 1 and self.init_std > 0):
            raise ValueError("lr and init_std must be > 0 and momentum in [0, 1)")

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_policy(cls, policy: Any, **changes: Any) -> TrainConfig:
        """The run of a :class:`~precision_lab.training.policy.Policy` (or a policy name): the
        numeric fields come from the policy, ``changes`` set the model and optimisation fields.

        >>> cfg = TrainConfig.from_policy("mixed_float16", epochs=2)
        >>> cfg.forward_format, cfg.master_format, cfg.loss_scaling, cfg.policy.name
        ('fp16', 'fp32', 'dynamic', 'mixed_float16')
        """
        p = get_policy(policy)
        numeric = p.train_fields()
        clash = sorted(set(changes) & set(numeric))
        if clash:
            raise ValueError(
                f"{clash[0]}: set by the policy; change the policy (Policy.replace) instead"
            )
        return cls(**{"name": p.name, "label": p.name, **numeric, "policy": p, **changes})


def make_scaler(cfg: TrainConfig) -> LossScaler:
    """A fresh loss scaler for ``cfg`` (static scale 1 when ``loss_scaling="none"``)."""
    if cfg.loss_scaling == "dynamic":
        return DynamicLossScaler.preset(
            cfg.scaler_preset, init_scale=cfg.loss_scale, **dict(cfg.scaler_options)
        )
    if cfg.loss_scaling == "static":
        return StaticLossScaler(cfg.loss_scale)
    return StaticLossScaler(1.0)


def _low(fmt: str) -> dict[str, Any]:
    keys = ("forward_format", "backward_format", "activation_format", "gradient_format")
    return dict.fromkeys(keys, fmt)


_FP16 = _low("fp16")
_BF16 = _low("bf16")

#: The runs of the report (seed 0; vary ``seed`` with :meth:`TrainConfig.replace`).
RUNS: dict[str, TrainConfig] = {
    "fp32": TrainConfig(name="fp32", label="FP32 baseline"),
    "fp16_noscale": TrainConfig(name="fp16_noscale", label="FP16, no loss scaling", **_FP16),
    "fp16_static": TrainConfig(
        name="fp16_static",
        label="FP16, static loss scale 2^12",
        loss_scaling="static",
        loss_scale=2.0**12,
        **_FP16,
    ),
    "fp16_dynamic": TrainConfig(
        name="fp16_dynamic",
        label="FP16, dynamic loss scaling (torch, interval 20)",
        loss_scaling="dynamic",
        loss_scale=2.0**16,
        scaler_preset="torch",
        scaler_options=(("growth_interval", 20),),
        **_FP16,
    ),
    "bf16": TrainConfig(name="bf16", label="BF16, no loss scaling", **_BF16),
    "fp8": TrainConfig(
        name="fp8",
        label="FP8 (E4M3 fwd, E5M2 bwd), delayed scaling",
        forward_format="e4m3",
        backward_format="e5m2",
        activation_format="bf16",
        gradient_format="bf16",
        tensor_scaling="delayed",
        amax_history_len=16,
    ),
}
