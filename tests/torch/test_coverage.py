"""Issue 34, coverage: every torch operation that runs a floating-point GEMM is emulated by
simulate or raises; none runs in FP32 unannounced.

Two oracles, independent of simulate's tables:

* the names: every overridable torch function whose name says GEMM (mm, matmul, mv, dot, inner,
  outer, ger, addr, einsum, tensordot, linear, conv, lstm, gru, rnn, attention, cdist,
  bilinear) is handled by simulate's mode (emulated or refused), or is in NOT_A_GEMM with its
  reason; a new GEMM function in a later torch fails here until it is handled;
* the kernels: a TorchDispatchMode records every ATen GEMM kernel (mm, bmm, addmm, baddbmm,
  convolution, the fused RNN kernels ...) that runs with floating-point inputs; under simulate,
  forward and backward of each sample call run none (the emulator computes with numpy), or the
  call raises NotImplementedError.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)
import sys  # noqa: E402

import torch.nn.functional as F  # noqa: E402
from torch.overrides import get_overridable_functions  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import precision_lab.torch as plt  # noqa: E402
import precision_lab.torch.simulate  # noqa: E402, F401

simmod = sys.modules["precision_lab.torch.simulate"]

_GEMM_NAME = re.compile(
    r"mm|matmul|mv|dot|inner|outer|ger$|addr|einsum|tensordot|linear|conv|lstm|gru|rnn|"
    r"attention|cdist|bilinear"
)
#: names the pattern catches that run no floating-point GEMM
NOT_A_GEMM = {
    "cummax": "a running maximum",
    "cummin": "a running minimum",
    "digamma": "special function",
    "digamma_": "special function",
    "igamma": "special function",
    "igamma_": "special function",
    "igammac": "special function",
    "igammac_": "special function",
    "lgamma": "special function",
    "lgamma_": "special function",
    "mvlgamma": "special function",
    "mvlgamma_": "special function",
    "polygamma": "special function",
    "polygamma_": "special function",
    "special_digamma": "special function",
    "special_gammainc": "special function",
    "special_gammaincc": "special function",
    "special_gammaln": "special function",
    "special_multigammaln": "special function",
    "special_polygamma": "special function",
    "fbgemm_linear_quantize_weight": "quantizes a weight (no product)",
    "fbgemm_pack_gemm_matrix_fp16": "packs a matrix (no product)",
    "fbgemm_pack_quantized_matrix": "packs a matrix (no product)",
}


def _gemm_functions() -> list[tuple[str, object]]:
    out = []
    for ns, funcs in get_overridable_functions().items():
        for f in funcs:
            name = getattr(f, "__name__", str(f))
            if _GEMM_NAME.search(name) and name not in NOT_A_GEMM:
                out.append((f"{getattr(ns, '__name__', ns)}.{name}", f))
    return out


def test_every_gemm_function_of_torch_is_handled():
    handled = simmod._GEMM_OPS
    funcs = _gemm_functions()
    assert len(funcs) > 80  # the enumeration really enumerates
    missing = [n for n, f in funcs if f not in handled]
    assert not missing, f"GEMM functions simulate neither emulates nor refuses: {missing}"


# ----- the kernels: no ATen GEMM on floating-point tensors under simulate -----------------------
_ATEN_GEMM = re.compile(
    r"^(mm|bmm|addmm|addmm_|baddbmm|baddbmm_|addbmm|addbmm_|mv|addmv|addmv_|dot|vdot|addr|"
    r"addr_|ger|outer|matmul|linear|_addmm_activation|convolution|_convolution|conv\w*|"
    r"cudnn\w*|mkldnn\w*|miopen\w*|lstm|gru|rnn_tanh|rnn_relu|\w*_cell|_thnn_fused\w*|"
    r"_scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*|einsum|tensordot|"
    r"_native_multi_head_attention|_transformer_encoder_layer_fwd|bilinear|_trilinear|"
    r"slow_conv\w*|thnn_conv\w*|_sparse\w*mm\w*|_int_mm|_scaled_mm)$"
)


class _Spy(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if _ATEN_GEMM.match(name):
            flat = [*args, *kwargs.values()]
            flat += [t for a in flat if isinstance(a, list | tuple) for t in a]
            if any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in flat):
                self.seen.append(name)
        return func(*args, **kwargs)


_g = torch.Generator().manual_seed(0)


def _r(*shape):
    return torch.randn(*shape, generator=_g).requires_grad_(True)


class _Call(torch.nn.Module):
    def __init__(self, fn, *mods):
        super().__init__()
        self.fn = fn
        self.mods = torch.nn.ModuleList(mods)

    def forward(self):
        return self.fn(*self.mods)


_A, _B, _V, _B3, _B4 = _r(3, 4), _r(4, 5), _r(4), _r(2, 3, 4), _r(2, 4, 5)
_X4 = _r(2, 4, 5, 6)
_SEQ = _r(5, 2, 4)
_MASK = torch.tensor([[False, False, False, False, True], [False, False, True, True, True]])

#: (name, call) -- every call runs at least one GEMM in plain torch
CALLS = [
    ("matmul", lambda: _A @ _B),
    ("mm", lambda: torch.mm(_A, _B)),
    ("bmm", lambda: torch.bmm(_B3, _B4)),
    ("addmm", lambda: torch.addmm(torch.ones(5), _A, _B, beta=0.5, alpha=2.0)),
    ("linear", lambda: F.linear(_A, _B.T, torch.ones(5))),
    ("mv", lambda: torch.mv(_A, _V)),
    ("dot", lambda: torch.dot(_V, _V)),
    ("vdot", lambda: torch.vdot(_V, _V)),
    ("inner", lambda: torch.inner(_A, _A)),
    ("outer", lambda: torch.outer(_V, _V)),
    ("addmv", lambda: torch.addmv(torch.ones(3), _A, _V)),
    ("addr", lambda: torch.addr(torch.ones(4, 4), _V, _V, alpha=3.0)),
    ("einsum", lambda: torch.einsum("bij,bjk->bik", _B3, _B4)),
    ("einsum3", lambda: torch.einsum("ij,jk,kl->il", _A, _B, _B.T)),
    ("tensordot", lambda: torch.tensordot(_B3, _B4, dims=([0, 2], [0, 1]))),
    ("baddbmm", lambda: torch.baddbmm(torch.ones(2, 3, 5), _B3, _B4, alpha=0.5)),
    ("addbmm", lambda: torch.addbmm(torch.ones(3, 5), _B3, _B4)),
    ("conv1d", lambda: F.conv1d(_SEQ.permute(1, 2, 0), _r(3, 4, 2))),
    ("conv2d_groups", lambda: F.conv2d(_X4, _r(4, 2, 3, 3), groups=2)),
    ("conv3d", lambda: F.conv3d(_X4[None], _r(2, 2, 2, 2, 2))),
    ("conv_transpose1d", lambda: F.conv_transpose1d(_X4[:, :, 0], _r(4, 2, 3), stride=2)),
    ("conv_transpose2d", lambda: F.conv_transpose2d(_X4, _r(4, 3, 2, 2), stride=2)),
    ("conv_transpose3d", lambda: F.conv_transpose3d(_X4[None], _r(2, 1, 2, 2, 2))),
    ("sdpa", lambda: F.scaled_dot_product_attention(_B3, _B3, _B3, is_causal=True)),
    ("linear_cross_entropy", lambda: F.linear_cross_entropy(_A, _B.T, torch.tensor([0, 1, 2]))),
    ("mha", lambda m: m(_SEQ, _SEQ, _SEQ, key_padding_mask=_MASK)[0]),
    ("lstm", lambda m: m(_SEQ)[0]),
    ("gru_cell", lambda m: m(_SEQ[0])),
    ("encoder", lambda m: m(_SEQ)),
    ("decoder", lambda m: m(_SEQ, _SEQ)),
]
_MODULES = {
    "mha": lambda: torch.nn.MultiheadAttention(4, 2),
    "lstm": lambda: torch.nn.LSTM(4, 3, num_layers=2, bidirectional=True),
    "gru_cell": lambda: torch.nn.GRUCell(4, 3),
    "encoder": lambda: torch.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0),
    "decoder": lambda: torch.nn.TransformerDecoderLayer(4, 2, 8, dropout=0.0),
}

#: (name, call) of GEMMs simulate refuses
REFUSED = [
    ("bilinear", lambda: F.bilinear(_A, _A, _r(2, 4, 4))),
    ("cdist", lambda: torch.cdist(_A, _A)),
    ("multi_dot", lambda: torch.linalg.multi_dot([_A, _B, _B.T])),
    ("vecdot", lambda: torch.linalg.vecdot(_A, _A)),
    ("addmm_", lambda: torch.zeros(3, 5).addmm_(_A, _B)),
    ("packed lstm", None),
]


def _run(fn, mods, policy):
    sim = plt.simulate(_Call(fn, *mods), policy)
    spy = _Spy()
    with spy:
        out = sim()
        if out.requires_grad:
            out.float().square().sum().backward()
    return out, spy.seen


@pytest.mark.parametrize(("name", "fn"), CALLS, ids=[n for n, _ in CALLS])
def test_no_float_gemm_kernel_runs_under_simulate(name, fn):
    mods = [_MODULES[name]()] if name in _MODULES else []
    # the oracle sees GEMM kernels in plain torch ...
    spy = _Spy()
    with spy:
        fn(*mods)
    # torch computes outer as an elementwise product (simulate: a GEMM with K = 1)
    assert bool(spy.seen) != (name == "outer"), f"{name}: torch's kernels {spy.seen}"
    # ... and none under simulate, forward and backward, for a policy and a recipe
    for policy in ("mixed_bfloat16", "te_mxfp8"):
        out, seen = _run(fn, mods, policy)
        assert not seen, f"{name} under {policy}: FP32 GEMM kernels ran: {seen}"
        assert torch.isfinite(out).all()


@pytest.mark.parametrize(("name", "fn"), REFUSED[:-1], ids=[n for n, _ in REFUSED[:-1]])
def test_refused_gemms_raise_before_any_kernel(name, fn):
    spy = _Spy()
    with spy, pytest.raises(NotImplementedError, match=r"simulate: "):
        plt.simulate(_Call(fn), "mixed_bfloat16")()
    assert not spy.seen


def test_packed_sequences_raise_naming_the_rewrite():
    lstm = torch.nn.LSTM(4, 3)
    packed = torch.nn.utils.rnn.pack_padded_sequence(_SEQ.detach(), [5, 3])
    with pytest.raises(NotImplementedError, match=r"PackedSequence.*pad_packed_sequence"):
        plt.simulate(lstm, "float32")(packed)
