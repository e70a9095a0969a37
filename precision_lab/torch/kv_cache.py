"""KV-cache quantization for inference: keys and values stored in FP8 or NVFP4.

:class:`KVCache` is a key/value cache with Hugging Face's ``Cache.update(key_states,
value_states, layer_idx)`` interface (it returns the layer's whole cached keys and values, new
tokens appended along the sequence axis ``-2``), whose stored tensors are quantized by a
:class:`KVQuant` and kept dequantized (float32 values on the quantized grid), so attention
reads what an FP8 / NVFP4 cache would give it:

* an element format (``"e4m3"``, ``"e5m2"``): per-tensor scale ``s = fmt.max / amax``
  (float32), ``x -> round(x * s) / s``, round to nearest even, saturating;
* ``"nvfp4"``: NVFP4 along the head dimension (blocks of 16, E4M3 block scales, FP32 tensor
  scale): the tensor's encode scale ``S_enc = 6 * 448 / amax`` from the given ``amax``, then
  :func:`precision_lab.quantize_blocks`' arithmetic (Transformer Engine's ``"amax"`` rule:
  ``s_b = e4m3(amax_b * (S_enc / 6))``, elements ``e2m1(x / (s_b / S_enc))``). With ``amax``
  equal to the data's own amax this is ``quantize_blocks(x, "nvfp4")`` bit for bit (tested).

``amax`` is a constant (ModelOpt's ``fp8_cast`` / ``nvfp4_cast`` KV presets pin a constant amax
instead of calibrating, published: ModelOpt's ``hf_ptq.py`` help, "set the amax to FP8 range
without data-driven calibration"; here ``fp8_cast`` is amax 448, so ``s = 1``, a plain
saturating cast, and ``nvfp4_cast`` amax ``6 * 448``, so ``S_enc = 1``: inferred from "cast")
or, with ``amax=None``, calibrated: inside ``with cache.calibrating():`` the cache stores
unquantized values and records each layer's largest ``|K|`` and ``|V|``, which later stores
use (per layer, separately for K and V).

:func:`~precision_lab.torch.simulate` with ``kv_cache=`` (a :class:`KVQuant` or a name of
:data:`KV_CACHE_PRESETS`) gives that quantization to every :class:`KVCache` passed to the
simulated model's forward without one of its own.

>>> import torch
>>> cache = KVCache("fp8_cast")
>>> k, v = cache.update(torch.tensor([[[0.3, 1000.0]]]), torch.ones(1, 1, 2), 0)
>>> k.tolist()        # E4M3: 0.3 -> 0.3125, 1000 saturates at 448
[[[0.3125, 448.0]]]
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..core.formats import FloatFormat, get_format
from ..core.rounding import round_to as _round_to
from ..quant.block_formats import get_block_format
from ..quant.block_layout import _nvfp4_s_enc
from ..scaling.fp8 import scale_from_amax

__all__ = ["KV_CACHE_PRESETS", "KVCache", "KVQuant", "get_kv_quant", "quantize_kv"]


@dataclasses.dataclass(frozen=True)
class KVQuant:
    """How a KV cache stores K and V: ``format`` (an element format or ``"nvfp4"``) and the
    per-tensor ``amax`` (a constant; None: calibrated, see the module)."""

    format: str = "e4m3"
    amax: float | None = 448.0

    def __post_init__(self) -> None:
        if self.format != "nvfp4":
            f = get_format(self.format, name="format")
            if not isinstance(f, FloatFormat):
                raise ValueError(f"format: expected 'nvfp4' or a float format, got {self.format!r}")
        if self.amax is not None and not (float(self.amax) > 0 and np.isfinite(self.amax)):
            raise ValueError(f"amax must be a positive finite number or None, got {self.amax!r}")


#: named KV-cache quantizations
KV_CACHE_PRESETS: dict[str, KVQuant] = {
    "fp8_cast": KVQuant("e4m3", 448.0),
    "nvfp4_cast": KVQuant("nvfp4", 6.0 * 448.0),
    "fp8": KVQuant("e4m3", None),
    "nvfp4": KVQuant("nvfp4", None),
}


def get_kv_quant(q: str | KVQuant) -> KVQuant:
    """A :class:`KVQuant` by name (:data:`KV_CACHE_PRESETS`) or itself."""
    if isinstance(q, KVQuant):
        return q
    if isinstance(q, str) and q in KV_CACHE_PRESETS:
        return KV_CACHE_PRESETS[q]
    raise ValueError(f"kv_cache: unknown quantization {q!r}; known: {', '.join(KV_CACHE_PRESETS)}")


def quantize_kv(x: torch.Tensor, q: str | KVQuant, amax: float | None = None) -> torch.Tensor:
    """``x`` stored as ``q`` says (dequantized, float32), with per-tensor ``amax`` (default
    ``q.amax``; the quantization's amax must be given one way or the other).

    >>> quantize_kv(torch.tensor([3.0, 0.2]), KVQuant("e4m3", amax=3.0)).tolist()  # scale 448/3
    [3.0, 0.2008928656578064]
    """
    kq = get_kv_quant(q)
    a = kq.amax if amax is None else amax
    if a is None:
        raise ValueError("quantize_kv: an amax is needed (a constant, or calibrate the cache)")
    x32 = x.detach().to(torch.float32)
    xs = x32.cpu().numpy()
    f32 = np.float32
    if kq.format == "nvfp4":
        bf = get_block_format("nvfp4")
        s_enc = _nvfp4_s_enc(f32(a), bf)
        s_dec = f32(1.0) / s_enc
        n = xs.shape[-1]
        pad = -n % bf.block_size
        xp = np.pad(xs, [(0, 0)] * (xs.ndim - 1) + [(0, pad)])
        blocks = xp.reshape(*xp.shape[:-1], -1, bf.block_size)
        amax_b = np.abs(blocks).max(axis=-1, keepdims=True)
        fmax = f32(np.finfo(np.float32).max)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            sb = amax_b * (s_enc * (f32(1.0) / f32(bf.element_max)))
            s = _round_to(np.minimum(sb, fmax), bf.scale, overflow="saturate").astype(f32)
            enc = np.minimum(f32(1.0) / (s * s_dec), fmax).astype(f32)
            e = _round_to(blocks * enc, bf.element, overflow="saturate").astype(f32)
            out = (e.astype(np.float64) * s * s_dec).astype(f32)
        out = out.reshape(xp.shape)[..., :n]
    else:
        fmt = get_format(kq.format)
        sc = f32(scale_from_amax(a, fmt))  # type: ignore[arg-type]
        with np.errstate(over="ignore", invalid="ignore"):
            qv = _round_to(xs * sc, fmt, overflow="saturate").astype(f32)  # type: ignore[arg-type]
            out = (qv * (f32(1.0) / sc)).astype(f32)
    return torch.from_numpy(np.ascontiguousarray(out)).to(x.device)


class KVCache:
    """A quantized key/value cache (see the module); ``quant``: a :class:`KVQuant`, a name of
    :data:`KV_CACHE_PRESETS`, or None (set by ``simulate(..., kv_cache=)``; a cache with no
    quantization stores values as they are)."""

    def __init__(self, quant: str | KVQuant | None = None) -> None:
        self.quant: KVQuant | None = None if quant is None else get_kv_quant(quant)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        #: calibrated amax per layer: ``{layer: (amax_k, amax_v)}``
        self.amax: dict[int, tuple[float, float]] = {}
        self._calibrating = False

    @contextlib.contextmanager
    def calibrating(self) -> Iterator[KVCache]:
        """Record each layer's ``max|K|``, ``max|V|`` (stores unquantized); the cache is
        emptied on exit, its amaxes kept."""
        self._calibrating = True
        try:
            yield self
        finally:
            self._calibrating = False
            self.keys, self.values = [], []

    def _store(self, x: torch.Tensor, layer: int, which: int) -> torch.Tensor:
        amx = float(x.detach().abs().max()) if x.numel() else 0.0
        if self._calibrating:
            old = self.amax.get(layer, (0.0, 0.0))
            new = list(old)
            new[which] = max(old[which], amx)
            self.amax[layer] = (new[0], new[1])
            return x
        if self.quant is None:
            return x
        a = self.quant.amax
        if a is None:
            if layer not in self.amax:
                raise ValueError(
                    f"KVCache: layer {layer} has no calibrated amax: run the model inside "
                    "`with cache.calibrating():` first, or use a constant amax (fp8_cast)"
                )
            a = self.amax[layer][which] or 1.0
        return quantize_kv(x, self.quant, a).to(x.dtype)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int = 0,
        cache_kwargs: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Store the new keys and values of layer ``layer_idx`` (quantized) and return all of
        the layer's cached keys and values (``(..., seq, head_dim)``)."""
        k = self._store(key_states, layer_idx, 0)
        v = self._store(value_states, layer_idx, 1)
        while len(self.keys) <= layer_idx:
            self.keys.append(k[..., :0, :])
            self.values.append(v[..., :0, :])
        self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=-2)
        self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=-2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The number of cached tokens of a layer."""
        return 0 if layer_idx >= len(self.keys) else int(self.keys[layer_idx].shape[-2])

    def reset(self) -> None:
        """Empty the cache (calibrated amaxes are kept)."""
        self.keys, self.values = [], []
