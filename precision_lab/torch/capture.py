"""Gradient capture: a real training step's gradients, and what a format does to them.

:class:`GradientCapture` (or :func:`capture_gradients`) hooks a ``torch.nn.Module``:

* every parameter (``param.register_hook``: the gradient of this backward pass, before it is
  accumulated into ``.grad``), named ``param:<name>`` (``param:fc1.weight``);
* the output of every module, the model itself and modules with children included (or of the
  modules named in ``modules``): the gradient of the loss with respect to that output, the
  *activation gradient* (``act:<module name>``; the model's own output is ``act:model``). By
  default an output tensor is recorded once, under the first module that returned it: a
  container returning its last child's output (``Sequential``), or a module returning its
  input unchanged (``Identity``), adds no entry, while a module that computes its output itself
  is recorded even when it has children (``torch.nn.MultiheadAttention``, whose ``out_proj``
  child is never called as a module; a block ending in a residual add). A module returning a
  tuple gets one entry per floating-point tensor that requires grad (``act:attn.0``,
  ``act:attn.1``). A module called several times in one step gets one entry per call
  (``act:blocks.0.attn#1`` ...). Gradients of tensors computed inside a module's ``forward``
  that no module returns (the softmax inside attention) are not recorded.

Each backward pass is one :class:`CapturedStep`. Per tensor it keeps the values as float32
(``float64`` gradients as float64) -- all of them, or with ``sample=n`` a seeded uniform sample
of ``n`` without replacement (the same seed, step and name give the same positions) -- and
:class:`TensorCounts`: exact counts over *all* values, whatever is kept: values, exact zeros,
inf/NaN, and for each of ``formats`` the non-zero finite values that become zero, subnormal or
overflow when cast to it unscaled (:func:`precision_lab.underflow_stats`' definitions).

From a step, one call each: :meth:`CapturedStep.underflow_stats` (per tensor and for all),
:meth:`CapturedStep.pick_loss_scale`, :meth:`GradientCapture.simulate` (a loss scaler over the
captured steps, :func:`precision_lab.scaling.simulate`) and :meth:`GradientCapture.diagnose`;
:meth:`CapturedStep.analyze` runs all four. :meth:`CapturedStep.save` writes the values with
:func:`precision_lab.gradients.save_gradients` (names made identifiers: ``param__fc1_weight``,
``act__blocks_0_attn``; ``meta`` says which is which).

>>> import torch, precision_lab.torch as plt
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
>>> with plt.capture_gradients(net, formats=("fp16",)) as cap:
...     net(torch.randn(5, 4)).square().mean().backward()
>>> step = cap.steps[0]
>>> sorted(step.grads)[:3]
['act:0', 'act:1', 'act:2']
>>> step.counts["param:0.weight"].n
12
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..analysis import LossScaleChoice, UnderflowStats, pick_loss_scale, underflow_stats
from ..core.formats import FloatFormat, get_format
from ..scaling import gradients as _gradients
from ..scaling.scalers import LossScaler
from ..scaling.simulate import Diagnosis, Simulation, diagnose
from ..scaling.simulate import simulate as _simulate

__all__ = [
    "Analysis",
    "CapturedStep",
    "GradientCapture",
    "TensorCounts",
    "capture_gradients",
]

DEFAULT_FORMATS = ("fp16", "bf16", "e4m3", "e5m2")


@dataclass(frozen=True)
class TensorCounts:
    """Exact counts over all values of one captured gradient tensor (not only the sample).

    ``zero``, ``subnormal`` and ``overflow`` map each format name to the number of non-zero
    finite values that become ±0, a non-zero subnormal, or overflow (inf/NaN, or beyond
    ``fmt.max``) when cast to it with round-to-nearest-even at scale 1.
    """

    n: int  #: values in the tensor
    n_zero: int  #: exact zeros (before any cast)
    n_nonfinite: int  #: inf/NaN
    n_kept: int  #: values kept in the step (``n``, or the sample size)
    zero: dict[str, int] = field(default_factory=dict)
    subnormal: dict[str, int] = field(default_factory=dict)
    overflow: dict[str, int] = field(default_factory=dict)

    @property
    def n_nonzero(self) -> int:
        """Non-zero finite values (the denominator of :func:`~precision_lab.underflow_stats`)."""
        return self.n - self.n_zero - self.n_nonfinite


def _counts(a: np.ndarray, formats: Sequence[FloatFormat], n_kept: int) -> TensorCounts:
    flat = a.reshape(-1)
    finite = np.isfinite(flat)
    n_nonfinite = int(flat.size - np.count_nonzero(finite))
    n_zero = int(np.count_nonzero(flat == 0))
    zero: dict[str, int] = {}
    sub: dict[str, int] = {}
    over: dict[str, int] = {}
    for f in formats:
        st = underflow_stats(flat, f)
        name = str(f)
        zero[name] = int(st.hist_zero.sum())
        sub[name] = int(st.hist_subnormal.sum())
        over[name] = round(st.overflow_fraction * st.n_nonzero)
    return TensorCounts(int(flat.size), n_zero, n_nonfinite, n_kept, zero, sub, over)


def _identifier(name: str) -> str:
    """``param:fc1.weight`` -> ``param__fc1_weight`` (a Python identifier, for ``.npz``)."""
    s = name.replace(":", "__")
    s = re.sub(r"\W", "_", s)
    return s if s.isidentifier() else f"g_{s}"


@dataclass(frozen=True)
class Analysis:
    """What :meth:`CapturedStep.analyze` found: per-format underflow statistics of all the
    step's values, the chosen loss scale, and (over the capture's steps) a scaler's simulation
    and its diagnosis."""

    underflow: dict[str, UnderflowStats]
    loss_scale: LossScaleChoice
    simulation: Simulation | None
    diagnosis: Diagnosis | None

    def __str__(self) -> str:
        lines = [st.summary() for st in self.underflow.values()]
        lines.append(f"loss scale 2**{self.loss_scale.log2_scale}: {self.loss_scale.reason}")
        if self.simulation is not None:
            lines.append(self.simulation.summary())
        if self.diagnosis is not None:
            lines.append(str(self.diagnosis))
        return "\n".join(lines)


@dataclass
class CapturedStep:
    """The gradients of one backward pass: ``grads`` (name -> numpy array of the kept values,
    flat), ``counts`` (name -> :class:`TensorCounts`), ``shapes`` (name -> the tensor's shape),
    ``formats`` (the formats counted), ``index`` (the step number) and ``sampled``."""

    index: int
    grads: dict[str, np.ndarray]
    counts: dict[str, TensorCounts]
    shapes: dict[str, tuple[int, ...]]
    formats: tuple[str, ...]
    sampled: bool

    def names(self, kind: str | None = None) -> list[str]:
        """The tensor names, in capture order; ``kind`` ``"param"`` or ``"act"`` filters."""
        if kind not in (None, "param", "act"):
            raise ValueError(f"kind must be None, 'param' or 'act', got {kind!r}")
        return [n for n in self.grads if kind is None or n.startswith(kind + ":")]

    def values(self, kind: str | None = None) -> np.ndarray:
        """All kept values (of ``kind``), concatenated in capture order (float64)."""
        parts = [self.grads[n].astype(np.float64).reshape(-1) for n in self.names(kind)]
        return np.concatenate(parts) if parts else np.zeros(0)

    def underflow_stats(
        self, fmt: str | FloatFormat, scale: float = 1.0, *, kind: str | None = None, **kw: Any
    ) -> dict[str, UnderflowStats]:
        """:func:`precision_lab.underflow_stats` of each tensor's kept values (name -> stats),
        plus ``"all"``: of all of them together."""
        out = {n: underflow_stats(self.grads[n], fmt, scale, **kw) for n in self.names(kind)}
        out["all"] = underflow_stats(self.values(kind), fmt, scale, **kw)
        return out

    def pick_loss_scale(
        self, fmt: str | FloatFormat = "fp16", *, kind: str | None = None, **kw: Any
    ) -> LossScaleChoice:
        """:func:`precision_lab.pick_loss_scale` over all kept values (of ``kind``)."""
        return pick_loss_scale(self.values(kind), fmt, **kw)

    def save(self, path: str | Path) -> Path:
        """Write the kept values with :func:`precision_lab.gradients.save_gradients` (names as
        identifiers, see the module); returns the path. ``load_gradients`` reads it back."""
        return _gradients.save_gradients(path, {_identifier(n): self.grads[n] for n in self.grads})

    def analyze(
        self,
        fmt: str | FloatFormat = "fp16",
        *,
        formats: Iterable[str | FloatFormat] | None = None,
        scaler: LossScaler | None = None,
        steps: Sequence[CapturedStep] | None = None,
        **pick: Any,
    ) -> Analysis:
        """One call: underflow statistics in each of ``formats`` (default: this step's counted
        formats), :meth:`pick_loss_scale` in ``fmt`` (``pick`` passes options), and with
        ``scaler`` its :func:`~precision_lab.scaling.simulate` over ``steps`` (default: this
        step alone) in ``fmt`` and the :func:`~precision_lab.scaling.diagnose` of that run."""
        fs = tuple(self.formats if formats is None else formats)
        under = {str(get_format(f)): underflow_stats(self.values(), f) for f in fs}
        choice = self.pick_loss_scale(fmt, **pick)
        sim = diag = None
        if scaler is not None:
            sim = _simulate(scaler, [s.grads for s in (steps or [self])], fmt)
            diag = diagnose(sim)
        return Analysis(under, choice, sim, diag)


class GradientCapture:
    """Hooks on ``model`` recording the gradients of each backward pass (see the module).

    Use it as a context manager (the hooks are removed on exit) or call :meth:`close`. Each
    backward pass while it is open is a step: ``steps``. Set ``enabled`` to False to let
    passes go by unrecorded (e.g. record every 20th step of a training run: the forward and the
    backward of a step see the same setting).

    Parameters
    ----------
    model:
        A ``torch.nn.Module``.
    params, activations:
        Record parameter gradients / activation gradients (module outputs).
    modules:
        Names of the modules whose outputs are recorded (``""`` is the model itself; default:
        every module, each output tensor once, see the module's docstring).
    sample:
        Keep a seeded uniform sample of at most this many values per tensor (None: all).
    seed:
        Seed of the sample positions (with the step index and the tensor's name).
    formats:
        Formats whose zero / subnormal / overflow counts are taken over all values.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        params: bool = True,
        activations: bool = True,
        modules: Iterable[str] | None = None,
        sample: int | None = None,
        seed: int = 0,
        formats: Iterable[str | FloatFormat] = DEFAULT_FORMATS,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int)):
            raise TypeError(f"sample must be None or an int >= 1, got {sample!r}")
        if sample is not None and sample < 1:
            raise ValueError(f"sample must be None or an int >= 1, got {sample!r}")
        fl = []
        for f in formats:
            ff = get_format(f)
            if not isinstance(ff, FloatFormat):
                raise ValueError(f"formats: {ff} is not a floating-point format")
            fl.append(ff)
        self.model = model
        #: record the passes (False: the hooks do nothing)
        self.enabled = True
        self.sample = sample
        self.seed = int(seed)
        self.formats: tuple[FloatFormat, ...] = tuple(fl)
        self.steps: list[CapturedStep] = []
        self._pending: dict[str, tuple[np.ndarray, TensorCounts, tuple[int, ...]]] = {}
        self._calls: dict[str, int] = {}
        self._handles: list[Any] = []
        self._expected = 0
        named = dict(model.named_modules())
        # default: every module, each output tensor once (ids of this pass's recorded outputs,
        # each entry removed when its tensor dies)
        self._dedup = modules is None
        self._recorded: dict[int, weakref.ref[torch.Tensor]] = {}
        if modules is None:
            chosen = list(named)
        else:
            chosen = list(modules)
            for n in chosen:
                if n not in named:
                    raise ValueError(f"modules: {model.__class__.__name__} has no module {n!r}")
        if activations:
            for n in chosen:
                self._handles.append(named[n].register_forward_hook(self._forward_hook(n)))
        if params:
            for n, p in model.named_parameters():
                if p.requires_grad:
                    self._handles.append(p.register_hook(self._record_hook(f"param:{n}")))

    # ----- hooks -------------------------------------------------------------------------------
    def _forward_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if not self.enabled:
                return
            outs = output if isinstance(output, tuple | list) else (output,)
            for j, o in enumerate(outs):
                if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point():
                    if self._dedup:
                        ref = self._recorded.get(id(o))
                        if ref is not None and ref() is o:
                            continue  # already recorded under the module that returned it
                        self._recorded[id(o)] = weakref.ref(o, self._forget(id(o)))
                    base = f"act:{name or 'model'}" + (f".{j}" if len(outs) > 1 else "")
                    if base in self._pending:  # a new forward after a recorded backward
                        self.end_step()
                    k = self._calls.get(base, 0)
                    self._calls[base] = k + 1
                    o.register_hook(self._record_hook(base if k == 0 else f"{base}#{k}"))

        return hook

    def _forget(self, key: int) -> Any:
        def callback(_ref: weakref.ref[torch.Tensor]) -> None:
            self._recorded.pop(key, None)

        return callback

    def _record_hook(self, name: str) -> Any:
        def hook(g: torch.Tensor) -> None:
            if self.enabled:
                self._record(name, g)

        return hook

    def _record(self, name: str, g: torch.Tensor) -> None:
        if name in self._pending:  # a second backward pass: the last step is complete
            self.end_step()
        t = g.detach()
        if t.dtype != torch.float64:
            t = t.to(torch.float32)
        a = t.cpu().numpy().reshape(-1).copy()
        kept = a
        if self.sample is not None and a.size > self.sample:
            rng = np.random.default_rng([self.seed, len(self.steps), *name.encode("utf-8")])
            idx = np.sort(rng.choice(a.size, size=self.sample, replace=False))
            kept = a[idx]
        counts = _counts(a, self.formats, int(kept.size))
        self._pending[name] = (kept, counts, tuple(g.shape))

    # ----- steps -------------------------------------------------------------------------------
    def end_step(self) -> CapturedStep | None:
        """Close the step recorded since the last one; returns it (None when nothing was
        recorded). A step also ends by itself when a tensor it holds is recorded again (the next
        forward or backward pass) and when the capture closes."""
        if not self._pending:
            self._calls.clear()
            return None
        names = list(self._pending)
        step = CapturedStep(
            index=len(self.steps),
            grads={n: self._pending[n][0] for n in names},
            counts={n: self._pending[n][1] for n in names},
            shapes={n: self._pending[n][2] for n in names},
            formats=tuple(str(f) for f in self.formats),
            sampled=self.sample is not None,
        )
        self.steps.append(step)
        self._pending = {}
        self._calls.clear()
        return step

    def values(self, kind: str | None = None) -> np.ndarray:
        """The kept values of every captured step (of ``kind``), concatenated (float64)."""
        self.end_step()
        parts = [s.values(kind) for s in self.steps]
        return np.concatenate(parts) if parts else np.zeros(0)

    def pick_loss_scale(
        self, fmt: str | FloatFormat = "fp16", *, kind: str | None = None, **kw: Any
    ) -> LossScaleChoice:
        """:func:`precision_lab.pick_loss_scale` over the kept values of every captured step."""
        return pick_loss_scale(self.values(kind), fmt, **kw)

    def simulate(
        self, scaler: LossScaler, fmt: str | FloatFormat = "fp16", **kw: Any
    ) -> Simulation:
        """:func:`precision_lab.scaling.simulate` of ``scaler`` over the captured steps."""
        self.end_step()
        return _simulate(scaler, [s.grads for s in self.steps], fmt, **kw)

    def diagnose(self, scaler: LossScaler, fmt: str | FloatFormat = "fp16", **kw: Any) -> Diagnosis:
        """:func:`precision_lab.scaling.diagnose` of :meth:`simulate`'s run."""
        return diagnose(self.simulate(scaler, fmt), **kw)

    def close(self) -> None:
        """Remove the hooks and close the last step."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.end_step()

    def __enter__(self) -> GradientCapture:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def capture_gradients(model: torch.nn.Module, **kwargs: Any) -> GradientCapture:
    """A :class:`GradientCapture` of ``model`` (keyword options as its constructor's); each
    backward pass is a step (see :meth:`GradientCapture.end_step`)."""
    return GradientCapture(model, **kwargs)
