"""A real training run under emulated mixed precision.

A small ReLU MLP in numpy with a hand-written backward pass (:mod:`.model`) is trained on
scikit-learn's handwritten digits (:mod:`.data`), every matmul through
:func:`precision_lab.gemm`, activations and gradients stored in low-precision formats with
:func:`precision_lab.round_to`, FP32 master weights, and any loss scaler of
:mod:`precision_lab.scaling`. A :class:`TrainConfig` holds each numeric choice in its own field;
:data:`RUNS` are the six runs of the report (FP32, FP16 without / with static / with dynamic loss
scaling, BF16, FP8 with delayed scaling).

>>> from precision_lab.training import RUNS, train
>>> r = train(RUNS["bf16"].replace(epochs=2, hidden=(16,)))
>>> 0.0 <= r.final_test_acc <= 1.0, r.steps
(True, 4)
"""

from .config import RUNS, TrainConfig, make_scaler
from .data import Dataset, load_digits_split
from .loop import LayerRecord, TrainResult, train, train_seeds
from .model import MLP, Numerics, softmax_xent

__all__ = [
    "MLP",
    "RUNS",
    "Dataset",
    "LayerRecord",
    "Numerics",
    "TrainConfig",
    "TrainResult",
    "load_digits_split",
    "make_scaler",
    "softmax_xent",
    "train",
    "train_seeds",
]
