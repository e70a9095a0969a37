"""Real PyTorch models: autograd-aware casts, gradient capture, emulated execution, loss scaling.

An optional subpackage: it needs PyTorch (``pip install 'precision_lab[torch]'``; a CPU build of
torch is enough). Without torch everything else in precision_lab works and importing this
module raises an ImportError that says how to install it.

* :mod:`.casts`: :func:`round_to`, :func:`quantize` / :func:`dequantize` /
  :func:`fake_quantize`, :func:`round_to_blocks` as autograd functions whose forward values are
  the numpy API's bit for bit and whose backward is a straight-through estimator (``grad="ste"``,
  the default), the clipped one (``"clipped_ste"``), or the identity (``"identity"``: the cast
  is switched off);
* :mod:`.capture`: :class:`GradientCapture` records, per parameter and per module output, the
  gradients a backward pass produces (all values or a seeded sample, with exact counts of zeros,
  subnormals and overflows in chosen formats), saves them in the format
  :func:`precision_lab.gradients.load_gradients` reads, and runs
  :func:`~precision_lab.underflow_stats`, :func:`~precision_lab.pick_loss_scale`,
  :func:`precision_lab.scaling.simulate` and :func:`~precision_lab.scaling.diagnose` on them;
* :mod:`.simulate`: :func:`simulate` (``simulate(model, policy)``) runs every GEMM of a model
  (Linear, convolutions of any dimension, groups and transposed, matmul / bmm / einsum /
  tensordot / mv / dot ..., ``nn.MultiheadAttention`` and the ``nn.Transformer*`` layers,
  RNN / LSTM / GRU gates: :mod:`precision_lab.torch.ops`, :mod:`.attention`, :mod:`.rnn`) through
  :func:`precision_lab.gemm` (emulated input formats, any :class:`~precision_lab.Accumulator`
  or tensor-core preset), forward and backward, refuses the GEMMs it cannot emulate, and runs
  its other operations by the policy's rules; ``simulate(model, recipe)`` (an FP4/FP8 training
  recipe, ``"te_nvfp4"``, ``"te_mxfp8"``, ``"deepseek_v3"`` ...) runs every GEMM's forward,
  dgrad and wgrad as :func:`precision_lab.apply_recipe` does, bit for bit, seeded
  deterministically;
* :mod:`.attention`: FP8 attention as FlashAttention-3 runs it (:func:`fp8_attention`,
  ``simulate(..., attention="fa3_fp8")``) and the underflow of its P cast (:func:`p_underflow`);
  :mod:`.kv_cache`: :class:`KVCache`, keys and values stored in FP8 / NVFP4;
* :mod:`.recipes`: the FP4-era recipe pieces as autograd functions: :func:`hadamard` (its
  gradient the exact transpose transform), :func:`quantize_operand` (one GEMM operand as a
  recipe's role quantizes it; ``grad`` as the casts) and :func:`recipe_matmul` (a recipe's
  linear layer, three GEMMs);
* :mod:`.scaler`: :class:`LossScaling` drives a real ``torch.optim`` optimizer step with any
  loss scaler of :mod:`precision_lab.scaling` (the presets of PyTorch, Keras, apex, DeepSpeed,
  Megatron), with torch's ``GradScaler`` trajectory where they coincide.

May import every layer below (core ... training); nothing below imports it (import-linter's
layers contract). Where a new thing goes: a new differentiable cast into :mod:`.casts`, a new
recipe piece into :mod:`.recipes`, a new emulated torch operation into :mod:`.simulate`.

>>> import torch, precision_lab.torch as plt
>>> x = torch.tensor([0.1, 1000.0], requires_grad=True)
>>> y = plt.round_to(x, "e4m3", overflow="saturate", grad="clipped_ste")
>>> y.sum().backward()
>>> y.tolist(), x.grad.tolist()
([0.1015625, 448.0], [1.0, 0.0])
"""

try:
    import torch as _torch  # noqa: F401
except ImportError:  # pragma: no cover - exercised where torch is missing
    raise ImportError(
        "precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]' "
        "(a CPU build of torch is enough)"
    ) from None

from .attention import ATTENTION_RECIPES, AttentionRecipe, fp8_attention, p_underflow
from .capture import CapturedStep, GradientCapture, TensorCounts, capture_gradients
from .casts import (
    GRAD_MODES,
    dequantize,
    fake_quantize,
    quantize,
    round_to,
    round_to_blocks,
)
from .kv_cache import KV_CACHE_PRESETS, KVCache, KVQuant
from .recipes import hadamard, quantize_operand, recipe_matmul
from .scaler import LossScaling
from .simulate import Simulated, emulated_matmul, simulate

__all__ = [
    "ATTENTION_RECIPES",
    "GRAD_MODES",
    "KV_CACHE_PRESETS",
    "AttentionRecipe",
    "CapturedStep",
    "GradientCapture",
    "KVCache",
    "KVQuant",
    "LossScaling",
    "Simulated",
    "TensorCounts",
    "capture_gradients",
    "dequantize",
    "emulated_matmul",
    "fake_quantize",
    "fp8_attention",
    "hadamard",
    "p_underflow",
    "quantize",
    "quantize_operand",
    "recipe_matmul",
    "round_to",
    "round_to_blocks",
    "simulate",
]
