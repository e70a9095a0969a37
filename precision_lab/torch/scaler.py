"""Loss scaling in a real torch training loop, driven by any scaler of :mod:`precision_lab.scaling`.

:class:`LossScaling` has ``torch.amp.GradScaler``'s interface (``scale(loss)``,
``unscale_(optimizer)``, ``step(optimizer)``, ``update()``, ``get_scale()``), with the scale rule
of a :class:`~precision_lab.scaling.LossScaler`: a preset name (``"torch"``, ``"keras"``,
``"apex"``, ``"deepspeed"``, ``"megatron"``: :data:`precision_lab.scaling.PRESETS`), or any
scaler object (``DynamicLossScaler(...)``, ``StaticLossScaler(...)``).

What an iteration does, as torch's GradScaler does it: ``scale(loss)`` multiplies the loss by
the scale (a float32 tensor); after ``backward``, ``unscale_(optimizer)`` (called by ``step``
unless done before, e.g. for gradient clipping) finds inf/NaN in the *scaled* gradients of the
optimizer's parameters (that optimizer's ``found_inf``; with ``fmt``: also a scaled gradient that
overflows when cast to ``fmt``, as :func:`precision_lab.scaling.simulate` counts it, for an FP32
model standing in for FP16 gradients) and multiplies them in place by ``inv_scale`` (``1/scale``
computed in float64 and rounded to float32,
:attr:`~precision_lab.scaling.LossScaler.inv_scale`); ``step(optimizer)`` takes the optimizer
step unless that optimizer's ``found_inf`` is set (and the scaler skips such steps:
``StaticLossScaler(skip_on_inf=False)`` does not). ``update()`` then updates the scaler once,
with ``found_inf`` of any optimizer stepped this iteration: the scale changes only there, so
with several optimizers (``step(oa); step(ob); update()``) every one is unscaled with the
iteration's scale. With the ``"torch"`` preset the scale history, the skipped steps and the
parameters equal ``torch.amp.GradScaler``'s, bit for bit (tests/torch/test_scaler.py runs
GradScaler beside it: init scales that are not powers of two, factors float32 cannot hold,
growth to the float32 ceiling, inf/NaN steps, ``unscale_`` with gradient clipping, two
optimizers).

``history`` keeps one row per iteration (per ``update()``): the scale used, ``found_inf``
(any optimizer), whether the scaler skipped the step, and the scale after the update
(:attr:`LossScaling.scales`, :attr:`LossScaling.skipped`, :attr:`LossScaling.found_inf`).

>>> import torch, precision_lab.torch as plt
>>> w = torch.nn.Parameter(torch.tensor([1.0]))
>>> opt = torch.optim.SGD([w], lr=0.1)
>>> ls = plt.LossScaling("torch", init_scale=2.0**127, growth_interval=1)
>>> for _ in range(5):
...     opt.zero_grad()
...     ls.scale((w * 4.0).sum()).backward()
...     ls.step(opt)
...     ls.update()
>>> import numpy as np                    # 4 * 2**126 overflows float32
>>> np.log2(ls.scales).astype(int).tolist(), ls.skipped.tolist()
([127, 126, 125, 126, 125], [True, True, False, True, False])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core.formats import FloatFormat, get_format
from ..core.rounding import round_to
from ..scaling.scalers import DynamicLossScaler, LossScaler

__all__ = ["LossScaling"]


class LossScaling:
    """``torch.amp.GradScaler``'s loop with a :mod:`precision_lab.scaling` scaler (see the
    module). ``scaler``: a preset name (``overrides`` go to
    :meth:`~precision_lab.scaling.DynamicLossScaler.preset`) or a scaler object; ``fmt``: a
    format whose overflow of the scaled gradients also counts as ``found_inf``."""

    def __init__(
        self, scaler: str | LossScaler = "torch", *, fmt: str | FloatFormat | None = None,
        **overrides: Any,
    ) -> None:  # fmt: skip
        if isinstance(scaler, str):
            scaler = DynamicLossScaler.preset(scaler, **overrides)
        elif overrides:
            raise TypeError("overrides are for a preset name; configure a scaler object directly")
        if not (hasattr(scaler, "update") and hasattr(scaler, "scale")):
            raise TypeError(f"scaler must be a preset name or a LossScaler, got {scaler!r}")
        self.scaler: LossScaler = scaler
        f = None if fmt is None else get_format(fmt)
        if f is not None and not isinstance(f, FloatFormat):
            raise ValueError(f"fmt must be a floating-point format, got {f}")
        self.fmt: FloatFormat | None = f
        self.history: list[tuple[float, bool, bool, float]] = []
        #: this iteration: found_inf per unscaled optimizer (by id), and the stepped ones
        self._unscaled: dict[int, bool] = {}
        self._stepped: set[int] = set()

    # ----- GradScaler's interface ----------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale."""
        return float(self.scaler.scale)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (the scale as a float32 tensor, as GradScaler multiplies)."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        s = torch.tensor(self.scaler.scale, dtype=torch.float32, device=loss.device)
        return loss * s

    def _grads(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Check the scaled gradients for inf/NaN (and overflow in ``fmt``), then multiply them
        by ``inv_scale`` in place; returns ``found_inf``. Once per step and optimizer."""
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer this step")
        found = False
        inv = float(self.scaler.inv_scale)
        for g in self._grads(optimizer):
            if not bool(torch.isfinite(g).all()):
                found = True
            elif self.fmt is not None:
                a = g.detach().to(torch.float64).cpu().numpy()
                with np.errstate(over="ignore", invalid="ignore"):
                    q = round_to(a, self.fmt)
                if not np.all(np.isfinite(q)):
                    found = True
            g.mul_(torch.tensor(inv, dtype=torch.float32, device=g.device))
        self._unscaled[id(optimizer)] = found
        return found

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless done) and take ``optimizer.step(*args, **kwargs)`` unless this
        optimizer's scaled gradients held inf/NaN and the scaler skips such steps; returns its
        result (None when skipped). The scale is not changed here (see :meth:`update`)."""
        if id(optimizer) in self._stepped:
            raise RuntimeError(
                "step() has already been called on this optimizer since the last update()"
            )
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        self._stepped.add(id(optimizer))
        skip = self._unscaled[id(optimizer)] and getattr(self.scaler, "skip_on_inf", True)
        return None if skip else optimizer.step(*args, **kwargs)

    def update(self) -> None:
        """End the iteration: update the scaler once with ``found_inf`` of every optimizer
        unscaled since the last update (any of them), as ``GradScaler.update()`` does."""
        if not self._unscaled:
            raise RuntimeError("update() without a step(): call step(optimizer) first")
        found = any(self._unscaled.values())
        used = float(self.scaler.scale)
        taken = self.scaler.update(found)
        self.history.append((used, found, not taken, float(self.scaler.scale)))
        self._unscaled = {}
        self._stepped = set()

    # ----- the record ----------------------------------------------------------------------------
    @property
    def scales(self) -> np.ndarray:
        """The scale each step's loss was multiplied by."""
        return np.array([h[0] for h in self.history], dtype=np.float64)

    @property
    def found_inf(self) -> np.ndarray:
        """Whether each step's scaled gradients held inf/NaN (or overflowed ``fmt``)."""
        return np.array([h[1] for h in self.history], dtype=bool)

    @property
    def skipped(self) -> np.ndarray:
        """Whether each step's optimizer step was skipped."""
        return np.array([h[2] for h in self.history], dtype=bool)

    def __repr__(self) -> str:
        return f"LossScaling({self.scaler!r}, fmt={None if self.fmt is None else str(self.fmt)})"
