"""The digits MLP trained under an FP4/FP8 recipe (:mod:`precision_lab.quant.recipes`).

:class:`RecipeMLP` replaces the three GEMMs of every layer by the recipe's: each operand is
quantized as its role says (block format along the contraction axis, rounding, random Hadamard
rotation of both operands), per replica, and the dequantized float32 operands are multiplied
with the fixed-order FP32 sums of :func:`~precision_lab.training.model.fixed_order_sum` (exact
products added in float64, rounded once: the same bits everywhere). The layer computes
``z = x @ W`` with ``W`` of shape (in, out), so the roles are: forward ``x @ W`` (contraction
over ``in``), dgrad ``dz @ W.T`` (over ``out``), wgrad ``x.T @ dz`` (over the batch; the
recipe's wgrad operands ``(dy, x)``). Stochastic rounding and rotation seeds are drawn per
(replica, step, layer, role, operand) from the replica's seed, so runs are reproducible and the
replicas independent. The block scaling inside the GEMM (:func:`~precision_lab.gemm_blocks`)
is not modelled here: :func:`precision_lab.gemm.apply_recipe` does that for one layer.

>>> from precision_lab.training import RUNS, train_seeds
>>> cfg = RUNS["fp32"].replace(epochs=1, hidden=(16,), batch_size=256)
>>> r = train_seeds(cfg, [0], model=recipe_model("te_nvfp4"))[0]
>>> len(r.test_acc)
1
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..quant.blocks import QuantizedBlocks, dequantize_blocks
from ..quant.recipes import Operand, Recipe, get_recipe, quantize_operand
from .config import TrainConfig
from .model import MLP, fixed_order_sum

__all__ = ["RecipeMLP", "recipe_model"]

_M64 = (1 << 64) - 1


class RecipeMLP(MLP):
    """:class:`~precision_lab.training.model.MLP` whose GEMMs follow a recipe (module docstring).

    The config's storage formats, loss scaling and optimizer still apply; its GEMM formats,
    accumulator and tensor scaling are replaced by the recipe's.
    """

    def __init__(
        self,
        sizes: list[int],
        cfg: TrainConfig,
        rngs: list[np.random.Generator],
        recipe: str | Recipe,
    ) -> None:
        super().__init__(sizes, cfg, rngs)
        self.recipe = get_recipe(recipe)
        self.calls = 0

    def _seed(self, r: int, layer: int, role: int) -> int:
        return (
            self.update_keys[r] * 0x9E3779B97F4A7C15 + self.calls * 1024 + layer * 8 + role * 2
        ) & _M64

    def _q(self, x: np.ndarray, op: Operand, axis: int, seed: int, hseed: int) -> np.ndarray:
        q = quantize_operand(x, op, axis=axis, seed=seed, hadamard_seed=hseed)
        v = dequantize_blocks(q) if isinstance(q, QuantizedBlocks) else q
        return np.asarray(v, dtype=np.float32)

    def _mm(
        self, a: np.ndarray, b: np.ndarray, oa: Operand, ob: Operand, layer: int, role: int
    ) -> np.ndarray:
        """Per replica: ``a[r] @ b[r]`` with the operands quantized along the contraction."""
        pa, pb = [], []
        for r in range(self.R):
            s = self._seed(r, layer, role)
            pa.append(self._q(a[r], oa, -1, s, s))
            pb.append(self._q(b[r], ob, 0, (s + 1) & _M64, s))
        with np.errstate(over="ignore", invalid="ignore"):  # (rotations may pad K alike)
            return fixed_order_sum(np.stack(pa), np.stack(pb)).astype(np.float32)

    def forward(self, x: np.ndarray, *, train: bool = False) -> np.ndarray:
        """Logits (R, B, C) of batches ``x`` (R, B, D), the forward GEMMs as the recipe says."""
        num, fw = self.num, self.recipe.forward
        h = num.store(np.asarray(x, dtype=np.float32), num.act)
        zs, xs = [], []
        for i, (w, b) in enumerate(zip(self.W, self.b, strict=True)):
            z = num.store(self._mm(h, w, fw.a, fw.b, i, 0) + b, num.act)
            xs.append(h)
            zs.append(z)
            h = np.maximum(z, np.float32(0)) if i < self.n_layers - 1 else z
        if train:
            self._cache = {"zs": zs, "qx": xs, "qw": list(self.W)}
            self.calls += 1
        return h

    def _backward_layers(
        self,
        dz: np.ndarray,
        zs: list[np.ndarray],
        qx: list[Any],
        qw: list[Any],
        stats: list[list[dict[str, Any]]],
        s: np.ndarray,
        record: bool,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        num, dg, wg_role = self.num, self.recipe.dgrad, self.recipe.wgrad
        gW: list[np.ndarray] = [np.empty(0)] * self.n_layers
        gb: list[np.ndarray] = [np.empty(0)] * self.n_layers
        for i in range(self.n_layers - 1, -1, -1):
            x = qx[i]
            # wgrad: x.T @ dz, contraction over the batch; the recipe's operands are (dy, x)
            wg = self._mm(np.swapaxes(x, -1, -2), dz, wg_role.b, wg_role.a, i, 2)
            if record:
                self._stats(stats, i, "weight", wg, s)
            gW[i] = num.store(wg, num.grad)
            gb[i] = num.store(dz.sum(axis=1, keepdims=True, dtype=np.float32), num.grad)
            if i:
                dh = self._mm(dz, np.swapaxes(qw[i], -1, -2), dg.a, dg.b, i, 1)
                mask = zs[i - 1] > 0
                if record:
                    self._stats(stats, i - 1, "act", np.where(mask, dh, np.float32(0)), s)
                dz = np.where(mask, num.store(dh, num.grad), np.float32(0))
        return gW, gb


def recipe_model(
    recipe: str | Recipe,
) -> Callable[[list[int], TrainConfig, list[np.random.Generator]], MLP]:
    """A ``model`` builder for :func:`~precision_lab.training.train_seeds` training under
    ``recipe`` (:class:`RecipeMLP`)."""
    r = get_recipe(recipe)

    def build(sizes: list[int], cfg: TrainConfig, rngs: list[np.random.Generator]) -> MLP:
        return RecipeMLP(sizes, cfg, rngs, r)

    return build
