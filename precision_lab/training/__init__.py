"""Training under emulated precision: the digits model and loop, precision policies, PTQ and QAT.

A small ReLU MLP in numpy with a hand-written backward pass (:mod:`.model`) is trained on
scikit-learn's handwritten digits (:mod:`.data`), every matmul through
:func:`precision_lab.gemm`, activations and gradients stored in low-precision formats with
:func:`precision_lab.round_to`, FP32 master weights, and any loss scaler of
:mod:`precision_lab.scaling`. A :class:`TrainConfig` holds each numeric choice in its own field;
:data:`RUNS` are the six runs of the report (FP32, FP16 without / with static / with dynamic loss
scaling, BF16, FP8 with delayed scaling).

Also here: :mod:`.policy` (``pl.Policy``: which format each part of a step uses, with the
presets of Keras, PyTorch AMP and Transformer Engine), :mod:`.policy_model` (the MLP run under
a policy), :mod:`.ptq` (INT8 post-training quantization) and :mod:`.qat` (quantization-aware
training).

May import every layer below: core, backends, quant, gemm, arith, analysis and scaling.

Where a new thing goes: a new precision policy is an entry of ``POLICIES`` in :mod:`.policy`; a
new training run of the report an entry of :data:`RUNS` in :mod:`.config`; a new model next to
:mod:`.model`.

>>> from precision_lab.training import RUNS, train
>>> r = train(RUNS["bf16"].replace(epochs=2, hidden=(16,)))
>>> 0.0 <= r.final_test_acc <= 1.0, r.steps
(True, 4)
"""

from .config import RUNS, TrainConfig, make_scaler
from .data import Dataset, load_digits_split
from .loop import LayerRecord, TrainResult, train, train_seeds
from .model import MLP, Numerics, softmax_xent
from .policy import POLICIES, Policy, get_policy
from .recipe_model import RecipeMLP, recipe_model

__all__ = [
    "MLP",
    "POLICIES",
    "RUNS",
    "Dataset",
    "LayerRecord",
    "Numerics",
    "Policy",
    "RecipeMLP",
    "TrainConfig",
    "TrainResult",
    "get_policy",
    "load_digits_split",
    "make_scaler",
    "recipe_model",
    "softmax_xent",
    "train",
    "train_seeds",
]
