"""Recurrent layers under :func:`~precision_lab.torch.simulate`: ``nn.RNN`` / ``nn.LSTM`` /
``nn.GRU`` and their cells, whose gate GEMMs torch runs inside one fused ATen op
(``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``, ``torch.rnn_relu``, ``torch.lstm_cell`` ...),
run here as the cell equations with emulated GEMMs.

For each layer and direction: the input GEMM of every gate for the whole sequence at once,
``x @ W_ih^T + b_ih`` (one emulated ``F.linear``: every output element is its own dot product,
so this equals a GEMM per time step), then per time step the hidden GEMM ``h @ W_hh^T + b_hh``
(one emulated ``F.linear``), the biases added in the GEMMs as a Linear's. The gate equations are
torch's (documented in ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN``), in float32:

* LSTM, gates in the order ``i, f, g, o`` (the rows of ``W_ih``): ``i = sigma(.)``, ``f =
  sigma(.)``, ``g = tanh(.)``, ``o = sigma(.)``, ``c' = f * c + i * g``, ``h' = o * tanh(c')``;
  with ``proj_size > 0``, ``h' = (o * tanh(c')) @ W_hr^T`` (one more emulated GEMM);
* GRU, gates ``r, z, n``: ``r = sigma(gi_r + gh_r)``, ``z = sigma(gi_z + gh_z)``, ``n =
  tanh(gi_n + r * gh_n)`` where ``gh_n = h @ W_hn^T + b_hn`` (``b_hn`` inside the product with
  ``r``, as torch and cuDNN place it), ``h' = (1 - z) * n + z * h``;
* RNN: ``h' = tanh(gi + gh)`` (or ``relu``).

The new ``h`` and ``c`` are stored in the activation format (as a layer's output). Several
layers feed each the previous one's output (both directions concatenated), with dropout between
layers in training; a reverse direction runs over the reversed sequence; ``batch_first`` and the
returned ``(output, h_n)`` / ``(output, (h_n, c_n))`` are torch's. A ``PackedSequence`` raises
NotImplementedError (pad it: ``nn.utils.rnn.pad_packed_sequence``).

>>> import torch, precision_lab.torch as plt
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> gru = torch.nn.GRU(3, 4)
>>> x = torch.randn(5, 2, 3)
>>> out, h = plt.simulate(gru, "float32")(x)
>>> ref, href = gru(x)
>>> bool((out - ref).abs().max() < 1e-6), torch.equal(out[-1], h[0])
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["RNN_OPS"]

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _cell(
    sim: Any,
    mode: str,
    gi: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor | None,
    w_hh: torch.Tensor,
    b_hh: torch.Tensor | None,
    w_hr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One time step from the input-gate pre-activations ``gi`` (``x W_ih^T + b_ih``)."""
    gh = sim._linear(h, w_hh, b_hh)
    if mode == "lstm":
        assert c is not None
        i, f, g, o = (gi + gh).chunk(4, -1)
        c2 = sim._after(None, torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g))
        h2 = torch.sigmoid(o) * torch.tanh(c2)
        h2 = sim._linear(h2, w_hr) if w_hr is not None else sim._after(None, h2)
        return h2, c2
    if mode == "gru":
        ir, iz, in_ = gi.chunk(3, -1)
        hr, hz, hn = gh.chunk(3, -1)
        r = torch.sigmoid(ir + hr)
        z = torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        return sim._after(None, (1 - z) * n + z * h), None
    act = torch.tanh if mode == "rnn_tanh" else torch.relu
    return sim._after(None, act(gi + gh)), None


def _layers(sim: Any, mode: str, *args: Any) -> Any:
    """``torch.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` (the padded form)."""
    if len(args) < 9 or isinstance(
        args[3], list | tuple
    ):  # packed: (data, batch_sizes, hx, params, ...)
        raise NotImplementedError(
            f"simulate: {mode} with a PackedSequence is not emulated: pad the sequence "
            "(nn.utils.rnn.pad_packed_sequence) and pass the padded tensor"
        )
    x, hx, params, has_bias, num_layers, dropout, train, bidirectional, batch_first = args[:9]
    if batch_first:
        x = x.transpose(0, 1)
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs)
    if mode == "lstm":
        h0, c0 = hx
    else:
        h0, c0 = hx, None
    hs, cs = [], []
    inp = x
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            ps = params[(layer * dirs + d) * per : (layer * dirs + d + 1) * per]
            w_ih, w_hh = ps[0], ps[1]
            b_ih, b_hh = (ps[2], ps[3]) if has_bias else (None, None)
            w_hr = ps[-1] if per in (3, 5) else None  # LSTM proj_size: W_hr last
            idx = layer * dirs + d
            h = h0[idx]
            c = None if c0 is None else c0[idx]
            seq = inp.flip(0) if d == 1 else inp
            gi = sim._linear(seq, w_ih, b_ih)  # (T, B, gates*H): the whole sequence
            ys = []
            for t in range(seq.shape[0]):
                h, c = _cell(sim, mode, gi[t], h, c, w_hh, b_hh, w_hr)
                ys.append(h)
            y = torch.stack(ys) if ys else seq.new_zeros(0, *h.shape)
            outs.append(y.flip(0) if d == 1 else y)
            hs.append(h)
            if c is not None:
                cs.append(c)
        inp = torch.cat(outs, -1) if dirs == 2 else outs[0]
        if dropout > 0 and train and layer < num_layers - 1:
            inp = F.dropout(inp, dropout, training=True)
    out = inp.transpose(0, 1) if batch_first else inp
    h_n = torch.stack(hs)
    if mode == "lstm":
        return out, h_n, torch.stack(cs)
    return out, h_n


def _cells(sim: Any, mode: str, x: torch.Tensor, hx: Any, w_ih: torch.Tensor,
           w_hh: torch.Tensor, b_ih: torch.Tensor | None = None,
           b_hh: torch.Tensor | None = None) -> Any:  # fmt: skip
    """``torch.lstm_cell`` / ``gru_cell`` / ``rnn_tanh_cell`` / ``rnn_relu_cell``."""
    gi = sim._linear(x, w_ih, b_ih)
    if mode == "lstm":
        h, c = hx
        return _cell(sim, mode, gi, h, c, w_hh, b_hh)
    return _cell(sim, mode, gi, hx, None, w_hh, b_hh)[0]


def _layer_op(mode: str) -> Callable[..., Any]:
    def run(sim: Any, *args: Any, **kw: Any) -> Any:
        return _layers(sim, mode, *args, *kw.values())

    return run


def _cell_op(mode: str) -> Callable[..., Any]:
    def run(sim: Any, *args: Any, **kw: Any) -> Any:
        return _cells(sim, mode, *args, **kw)

    return run


#: torch function -> ``handler(sim, *args, **kwargs)``
RNN_OPS: dict[Any, Callable[..., Any]] = {
    torch.lstm: _layer_op("lstm"),
    torch.gru: _layer_op("gru"),
    torch.rnn_tanh: _layer_op("rnn_tanh"),
    torch.rnn_relu: _layer_op("rnn_relu"),
    torch.lstm_cell: _cell_op("lstm"),
    torch.gru_cell: _cell_op("gru"),
    torch.rnn_tanh_cell: _cell_op("rnn_tanh"),
    torch.rnn_relu_cell: _cell_op("rnn_relu"),
}
