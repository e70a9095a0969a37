"""A character-level language model trained under emulated precisions (issue 34).

A small GPT (:class:`CharGPT`: token and position embeddings, pre-norm blocks of causal
``F.scaled_dot_product_attention`` or ``nn.TransformerEncoderLayer`` and a GELU MLP, a linear
head) is trained on a fixed text corpus (:func:`corpus`: modules of the Python standard library
that every interpreter ships, :data:`CORPUS_FILES`) once per entry of :data:`RUNS`, with every
GEMM through :func:`precision_lab.torch.simulate`: FP32, ``mixed_bfloat16``, ``mixed_float16``
with a dynamic loss scaler started at the scale :func:`precision_lab.pick_loss_scale` picks on
the first step's gradients, and the ``te_mxfp8`` and ``te_nvfp4`` recipes (their own
accumulators). Per run: the training loss per step, the held-out loss at the end, the
gradient underflow per parameter tensor (:func:`precision_lab.torch.capture_gradients`, every
``capture_every`` steps) and the loss-scale trajectory.

**Which numbers are machine independent (the report's rule: no BLAS behind a number).** Every
GEMM, the FP32 baseline's included, is emulated (``simulate(model, "float32")`` sums in FP32
sequentially, each addition rounded once): no BLAS, no thread-dependent order. The data, the
initial weights (numpy's PCG64) and the batches are seeded. torch runs with one thread. What
remains is torch's own CPU kernels for the non-GEMM operations (layer norm, softmax,
cross-entropy, GELU, Adam): elementwise IEEE operations, but vectorised reductions and
``exp``/``erf`` whose bits ATen picks by the CPU's instruction set (its "CPU capability":
``default``, ``avx2``, ``avx512`` on x86). So the report's study runs in a fresh interpreter
with ``ATEN_CPU_CAPABILITY=default`` (:func:`run_study_portable`): ATen's portable kernels,
which every x86 CPU runs and whose bits do not depend on which vector units it has. The result
records that capability and the torch version (another torch release may change its kernels).
The decision, then: machine-independent GEMMs by construction, the rest pinned to kernels that
every machine runs, and the report's numbers rounded to three decimals. The corpus is the
interpreter's own files: :func:`corpus` records their SHA-256 (another Python release may ship
other text, and then other numbers).

The run list is data (:data:`RUNS`): a new precision is one :class:`LMRun` line naming a policy
or recipe that :func:`~precision_lab.torch.simulate` accepts.

>>> text, files = corpus()
>>> sorted(files) == sorted(CORPUS_FILES) and len(text) > 50_000
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import pickle
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..analysis import pick_loss_scale
from ..scaling.scalers import DynamicLossScaler
from ..torch import LossScaling, capture_gradients, simulate
from .text import signed

__all__ = [
    "CORPUS_FILES",
    "RUNS",
    "CharGPT",
    "LMConfig",
    "LMResult",
    "LMRun",
    "RunResult",
    "corpus",
    "markdown",
    "run_study",
    "run_study_portable",
]

#: The corpus: these modules of the standard library (``sysconfig.get_paths()["stdlib"]``),
#: concatenated in this order; prose-heavy docstrings and code. Non-ASCII characters become "?".
CORPUS_FILES = ("heapq.py", "textwrap.py", "bisect.py", "colorsys.py", "sched.py", "fnmatch.py")


@dataclasses.dataclass(frozen=True)
class LMRun:
    """One training run: ``label`` (the report's name) and ``numerics``, a policy or recipe
    name that :func:`~precision_lab.torch.simulate` takes (``attention``: its attention
    recipe, passed as ``attention=``); ``loss_scaling``: drive the optimizer
    through :class:`~precision_lab.torch.LossScaling` (PyTorch's dynamic rule) started at the
    scale :func:`~precision_lab.pick_loss_scale` picks for ``loss_scale_format`` on the first
    step's FP32 gradients."""

    label: str
    numerics: str
    loss_scaling: bool = False
    loss_scale_format: str = "fp16"
    #: an attention recipe for ``simulate(..., attention=)`` (FP8 attention), where the
    #: library has that option; None: attention's GEMMs follow ``numerics``
    attention: str | None = None


#: The runs of the study, in the report's order (the first is the baseline of the gaps).
RUNS: tuple[LMRun, ...] = (
    LMRun("FP32", "float32"),
    LMRun("BF16 mixed", "mixed_bfloat16"),
    LMRun("FP16 mixed + loss scaling", "mixed_float16", loss_scaling=True),
    LMRun("MXFP8 (te_mxfp8)", "te_mxfp8"),
    LMRun("NVFP4 (te_nvfp4)", "te_nvfp4"),
    LMRun("BF16 + FP8 attention (fa3_fp8)", "mixed_bfloat16", attention="fa3_fp8"),
    LMRun("DeepSeek-V3 FP8", "deepseek_v3_fp8"),
)


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Model and training sizes. The default fits ``make figures``' budget (about a minute
    and a half on two quiet cores); :meth:`long` is the issue's size (d = 128, context 64)."""

    d: int = 64
    heads: int = 4
    layers: int = 2
    context: int = 32
    batch: int = 8
    steps: int = 120
    lr: float = 3e-3
    seed: int = 0
    attention: str = "sdpa"
    capture_every: int = 10
    eval_batches: int = 4
    underflow_formats: tuple[str, ...] = ("fp16", "e4m3", "e5m2")

    @classmethod
    def long(cls) -> LMConfig:
        """The issue's model (d = 128, 4 heads, 2 layers, context 64, batch 8), 600 steps."""
        return cls(d=128, context=64, steps=600, lr=2e-3, capture_every=25)


def corpus() -> tuple[str, dict[str, str]]:
    """The training text and ``{file: sha256}`` of the files it was read from.

    >>> text, files = corpus()
    >>> text[:3].isascii()
    True
    """
    root = sysconfig.get_paths()["stdlib"]
    parts, digests = [], {}
    for name in CORPUS_FILES:
        with open(os.path.join(root, name), "rb") as f:
            raw = f.read()
        digests[name] = hashlib.sha256(raw).hexdigest()
        parts.append(raw.decode("utf-8").encode("ascii", "replace").decode("ascii"))
    return "\n".join(parts), digests


class _Block(torch.nn.Module):
    """One pre-norm transformer block: causal self-attention and a GELU MLP, each residual."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(n, length, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(n, length, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CharGPT(torch.nn.Module):
    """A small GPT over characters: ``vocab`` tokens, ``layers`` blocks of width ``d`` with
    ``heads`` heads, contexts of up to ``context`` characters; ``attention``: ``"sdpa"``
    (explicit q, k, v projections and ``F.scaled_dot_product_attention``, causal) or
    ``"encoder"`` (``nn.TransformerEncoderLayer``, pre-norm, GELU, with a causal mask). The
    forward takes token ids ``(batch, length)`` and returns the logits ``(batch, length,
    vocab)``. Initialised from ``numpy.random.default_rng(seed)`` (GPT-2's
    normal init, std 0.02, the residual projections' scaled by ``1/sqrt(2 layers)``; biases
    zero, LayerNorm weights one).

    >>> m = CharGPT(vocab=10, d=16, heads=2, layers=1, context=8)
    >>> m(torch.zeros(2, 8, dtype=torch.long)).shape
    torch.Size([2, 8, 10])
    """

    def __init__(
        self,
        *,
        vocab: int,
        d: int = 128,
        heads: int = 4,
        layers: int = 2,
        context: int = 64,
        attention: str = "sdpa",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if attention not in ("sdpa", "encoder"):
            raise ValueError(f"attention must be 'sdpa' or 'encoder', got {attention!r}")
        if d % heads:
            raise ValueError(f"d must be a multiple of heads, got d={d}, heads={heads}")
        rng = np.random.default_rng(seed)
        self.context = context
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(context, d)
        self.attention = attention
        blocks: list[torch.nn.Module] = []
        for _ in range(layers):
            if attention == "sdpa":
                blocks.append(_Block(d, heads))
            else:
                blocks.append(torch.nn.TransformerEncoderLayer(
                    d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                    norm_first=True))  # fmt: skip
        self.blocks = torch.nn.ModuleList(blocks)
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    residual = name.endswith(("proj.weight", "fc2.weight", "linear2.weight"))
                    std = 0.02 / math.sqrt(2 * layers) if residual else 0.02
                    w = rng.standard_normal(tuple(p.shape)) * std  # (numpy: the same bits on
                    p.copy_(torch.from_numpy(w.astype(np.float32)))  # every CPU; torch.randn's
                    # vectorised Box-Muller depends on the CPU's instruction set)
                elif name.endswith("bias"):
                    p.zero_()

    def forward(self, idx: torch.Tensor) -> Any:
        """Next-character logits for the character codes ``idx`` (batch, length)."""
        length = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(length))
        if self.attention == "sdpa":
            for b in self.blocks:
                x = b(x)
        else:
            mask = torch.ones(length, length, dtype=torch.bool).triu(1)
            for b in self.blocks:
                x = b(x, src_mask=mask, is_causal=True)
        return self.head(self.ln(x))


# ----------------------------------------------------------------------------------------------
# the study
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    """One run's record: the training loss per step, the held-out loss after the last step,
    the loss scale per step (loss-scaled runs) and the steps the scaler skipped."""

    run: LMRun
    losses: np.ndarray
    eval_loss: float
    scales: np.ndarray | None = None
    skipped: int = 0
    init_scale: float | None = None
    seconds: float = 0.0


@dataclasses.dataclass
class LMResult:
    """The study: its configuration, the runs, and the gradient underflow of the baseline run.

    ``underflow[(fmt, scaled)]`` is an array (parameter tensors x capture steps): the fraction
    of the non-zero gradient values of the baseline (first) run that become zero in ``fmt``,
    unscaled (``scaled=False``) or multiplied by the loss scale the library picked
    (``scaled=True``); ``params`` and ``capture_steps`` label its axes."""

    config: LMConfig
    runs: list[RunResult]
    params: list[str]
    capture_steps: list[int]
    underflow: dict[tuple[str, bool], np.ndarray]
    corpus_files: dict[str, str]
    vocab: int
    corpus_chars: int
    capability: str
    picked_scale: float | None = None
    torch_version: str = ""


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread (no thread-count-dependent reductions), restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _data(config: LMConfig) -> dict[str, Any]:
    """Token ids of the corpus, the seeded training batches (steps, batch, context + 1) and the
    held-out batches (the last tenth of the text)."""
    text, files = corpus()
    chars = sorted(set(text))
    lut = np.zeros(128, dtype=np.int64)
    lut[[ord(ch) for ch in chars]] = np.arange(len(chars))
    ids = lut[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    split = len(ids) * 9 // 10
    train, held = ids[:split], ids[split:]
    span = config.context + 1
    rng = np.random.default_rng(config.seed + 1)
    starts = rng.integers(0, len(train) - span, size=(config.steps, config.batch))
    batches = train[starts[..., None] + np.arange(span)]
    rng_e = np.random.default_rng(config.seed + 2)
    starts_e = rng_e.integers(0, len(held) - span, size=(config.eval_batches, config.batch))
    evals = held[starts_e[..., None] + np.arange(span)]
    return {"batches": batches, "evals": evals, "vocab": len(chars), "files": files,
            "chars": len(text)}  # fmt: skip


def _model(config: LMConfig, vocab: int) -> CharGPT:
    c = config
    return CharGPT(vocab=vocab, d=c.d, heads=c.heads, layers=c.layers, context=c.context,
                   attention=c.attention, seed=c.seed)  # fmt: skip


def _loss(model: torch.nn.Module, batch: np.ndarray, vocab: int) -> torch.Tensor:
    t = torch.from_numpy(batch)
    logits = model(t[:, :-1])
    return F.cross_entropy(logits.reshape(-1, vocab), t[:, 1:].reshape(-1))


def _picked_scale(config: LMConfig, data: dict[str, Any], fmt: str) -> float:
    """The loss scale :func:`~precision_lab.pick_loss_scale` picks for ``fmt`` on the FP32
    (emulated) gradients of the initial model's first step."""
    net = _model(config, data["vocab"])
    _loss(simulate(net, "float32"), data["batches"][0], data["vocab"]).backward()
    g = np.concatenate(
        [p.grad.detach().numpy().ravel() for p in net.parameters() if p.grad is not None]
    )
    return float(pick_loss_scale(g, fmt).scale)


def _train(
    run: LMRun,
    config: LMConfig,
    data: dict[str, Any],
    *,
    capture: bool,
    init_scale: float | None,
) -> tuple[RunResult, Any]:
    vocab = data["vocab"]
    net = _model(config, vocab)
    extra: dict[str, Any] = {} if run.attention is None else {"attention": run.attention}
    sim = simulate(net, run.numerics, seed=config.seed, **extra)
    opt = torch.optim.Adam(net.parameters(), lr=config.lr, foreach=False)
    scaling = None
    if run.loss_scaling:
        scaling = LossScaling(DynamicLossScaler.preset("torch", init_scale=init_scale),
                              fmt=run.loss_scale_format)  # fmt: skip
    cap = None
    if capture:
        cap = capture_gradients(net, activations=False, formats=config.underflow_formats)
    losses = np.empty(config.steps)
    t0 = time.perf_counter()
    try:
        for step in range(config.steps):
            if cap is not None:
                cap.enabled = step % config.capture_every == 0
            opt.zero_grad(set_to_none=True)
            loss = _loss(sim, data["batches"][step], vocab)
            if scaling is None:
                loss.backward()
                opt.step()
            else:
                scaling.scale(loss).backward()
                scaling.step(opt)
                scaling.update()
            losses[step] = float(loss.detach())
    finally:
        if cap is not None:
            cap.close()
    sim.eval()
    with torch.no_grad():
        ev = [float(_loss(sim, b, vocab)) for b in data["evals"]]
    res = RunResult(
        run,
        losses,
        float(np.mean(np.asarray(ev, dtype=np.float64))),
        None if scaling is None else scaling.scales,
        0 if scaling is None else int(scaling.skipped.sum()),
        init_scale,
        time.perf_counter() - t0,
    )
    return res, cap


def run_study_portable(config: LMConfig | None = None) -> LMResult:
    """:func:`run_study` in a fresh interpreter whose torch uses ATen's portable CPU kernels
    (``ATEN_CPU_CAPABILITY=default``, which must be set before torch is imported): the report's
    numbers then do not depend on the CPU's vector units (AVX2, AVX-512 ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, out = Path(tmp) / "config.pkl", Path(tmp) / "result.pkl"
        cfg.write_bytes(pickle.dumps(config or LMConfig()))
        code = (
            "import pickle, sys\n"
            "from pathlib import Path\n"
            "from precision_lab.studies import language_model as lm\n"
            "r = lm.run_study(pickle.loads(Path(sys.argv[1]).read_bytes()))\n"
            "Path(sys.argv[2]).write_bytes(pickle.dumps(r))\n"
        )
        env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
        subprocess.run([sys.executable, "-c", code, str(cfg), str(out)], env=env, check=True)
        result: LMResult = pickle.loads(out.read_bytes())
    return result


def run_study(
    config: LMConfig | None = None,
    runs: Sequence[LMRun] = RUNS,
    *,
    progress: Any = None,
) -> LMResult:
    """Train the model once per entry of ``runs`` (the first is the baseline: its gradients
    are captured for the underflow maps) and return the record. ``progress(label, seconds)``
    is called after each run.

    >>> cfg = LMConfig(d=16, heads=2, layers=1, context=8, batch=2, steps=3, capture_every=2)
    >>> r = run_study(cfg, RUNS[:2])
    >>> [x.run.label for x in r.runs], r.capture_steps
    (['FP32', 'BF16 mixed'], [0, 2])
    """
    config = config or LMConfig()
    if not runs:
        raise ValueError("runs must name at least one run (the first is the baseline)")
    with _one_thread():
        data = _data(config)
        need = [r for r in runs if r.loss_scaling]
        picked = {r.loss_scale_format: _picked_scale(config, data, r.loss_scale_format)
                  for r in need}  # fmt: skip
        results, cap0 = [], None
        for i, run in enumerate(runs):
            res, cap = _train(run, config, data, capture=i == 0,
                              init_scale=picked.get(run.loss_scale_format) if run.loss_scaling
                              else None)  # fmt: skip
            results.append(res)
            if i == 0:
                cap0 = cap
            if progress is not None:
                progress(run.label, res.seconds)
    assert cap0 is not None
    steps = cap0.steps
    params = [n[len("param:") :] for n in steps[0].names("param")] if steps else []
    fp16_scale = picked.get("fp16")
    under: dict[tuple[str, bool], np.ndarray] = {}
    for fmt in config.underflow_formats:
        under[(fmt, False)] = np.array(
            [
                [
                    _zero_fraction(s.counts[f"param:{p}"].zero[fmt], s.counts[f"param:{p}"])
                    for s in steps
                ]
                for p in params
            ]
        )
    if fp16_scale is not None and "fp16" in config.underflow_formats:
        from ..analysis import underflow_stats

        under[("fp16", True)] = np.array(
            [
                [
                    underflow_stats(s.grads[f"param:{p}"], "fp16", fp16_scale).zero_fraction
                    for s in steps
                ]
                for p in params
            ]
        )
    return LMResult(
        config=config,
        runs=results,
        params=params,
        capture_steps=[i * config.capture_every for i in range(len(steps))],
        underflow=under,
        corpus_files=data["files"],
        vocab=data["vocab"],
        corpus_chars=data["chars"],
        capability=str(torch.backends.cpu.get_cpu_capability()).lower(),
        picked_scale=fp16_scale,
        torch_version=str(torch.__version__),
    )


def _zero_fraction(zero: int, counts: Any) -> float:
    n = counts.n_nonzero
    return zero / n if n else 0.0


def _tail(losses: np.ndarray, n: int = 20) -> float:
    """The mean training loss of the last ``n`` steps (float64)."""
    return float(np.mean(losses[-n:]))


def markdown(result: LMResult) -> str:
    """The report's table and text for ``result``: numbers rounded to 3 decimals."""
    c = result.config
    base = result.runs[0]
    lines = [
        f"A character-level GPT ({c.layers} layers, d = {c.d}, {c.heads} heads, causal "
        f"`F.scaled_dot_product_attention`, context {c.context}, batch {c.batch}, Adam lr "
        f"{c.lr:g}) trained {c.steps} steps on {result.corpus_chars:,} characters of the "
        f"Python standard library ({', '.join(f'`{f}`' for f in CORPUS_FILES)}; "
        f"{result.vocab} distinct characters, the last tenth held out), every GEMM emulated "
        "by `precision_lab.torch.simulate` (`precision_lab.studies.language_model`). "
        "Seeded: the same batches and initial weights for every run.",
        "",
        "| run | numerics | train loss (last 20 steps) | held-out loss | held-out gap to "
        f"{base.run.label} | skipped steps |",
        "|---|---|---|---|---|---|",
    ]
    for r in result.runs:
        gap = r.eval_loss - base.eval_loss
        lines.append(
            f"| {r.run.label} | `{r.run.numerics}`"
            + ("" if r.run.attention is None else f", attention `{r.run.attention}`")
            + f" | {_tail(r.losses):.3f} | {r.eval_loss:.3f} "
            f"| {signed(gap, 3)} | {r.skipped if r.scales is not None else '-'} |"
        )
    lines.append("")
    scaled = [r for r in result.runs if r.scales is not None]
    for r in scaled:
        assert r.scales is not None
        lo, hi = int(math.log2(float(r.scales.min()))), int(math.log2(float(r.scales.max())))
        span = f"stays at 2^{lo}" if lo == hi else f"ranges over 2^{lo} .. 2^{hi}"
        lines.append(
            f"- {r.run.label}: the loss scale starts at 2^{int(math.log2(r.init_scale or 1))} "
            f"(`pick_loss_scale` on the first step's FP32 gradients, "
            f"{r.run.loss_scale_format}) and {span} under PyTorch's dynamic rule (halved on "
            f"an overflow, doubled after 2000 clean steps); {r.skipped} of {len(r.scales)} "
            "steps skipped."
        )
    for (fmt, sc), arr in sorted(result.underflow.items()):
        if arr.size:
            how = "at the picked loss scale" if sc else "unscaled"
            worst = int(np.argmax(arr.mean(axis=1)))
            lines.append(
                f"- Gradient underflow of the {base.run.label} run in {fmt} ({how}): "
                f"{100 * float(arr.mean()):.1f}% of the non-zero values on average over "
                f"parameters and captured steps; worst tensor `{result.params[worst]}` "
                f"({100 * float(arr[worst].mean()):.1f}%)."
            )
    if c.attention == "sdpa" and any(p.endswith("qkv.bias") for p in result.params):
        lines.append(
            "- The `qkv.bias` rows stand out: the key third of that bias has an exactly zero "
            "gradient in exact arithmetic (it adds `q . b_k` to every score of a row, which "
            "softmax ignores), so its computed gradient is rounding residue, far below the "
            "rest: about a third of `qkv.bias` flushes in fp16 at every captured step."
        )
    lines += [
        "",
        "No BLAS call is behind these numbers: the FP32 baseline is `simulate(model, "
        '"float32")` (FP32 sums in a fixed order), torch runs on one thread. The non-GEMM '
        "operations (layer norm, softmax, GELU, cross-entropy, Adam) are torch's CPU kernels, "
        "whose vectorised reductions and exp/erf ATen picks by CPU: these numbers are torch "
        f"{result.torch_version or torch.__version__}'s with ATen CPU capability "
        f"`{result.capability}` (the figure job sets `ATEN_CPU_CAPABILITY=default`: ATen's "
        "portable kernels, so the CPU's vector units, AVX2 or AVX-512, do not change these "
        "numbers). Corpus files' "
        "SHA-256 (first 12 hex digits): "
        + ", ".join(f"`{f}` {h[:12]}" for f, h in result.corpus_files.items())
        + ".",
    ]
    return "\n".join(lines)
