"""precision_lab on a real PyTorch model: capture its gradients, choose its loss scale, train it
emulated on a chosen GPU's tensor cores.

The model is a one-block attention classifier (torch.nn only) on synthetic data with a known
answer: the label of a sequence is the argmax of a fixed random "teacher" map of its mean token,
so FP32 training can reach close to 100%. The script

1. trains it in FP32 for a few epochs, capturing the gradients of every parameter and layer
   output at a few steps (``precision_lab.torch.capture_gradients``);
2. prints, per format, the share of gradients an unscaled cast would lose, the FP16 loss scale
   ``pick_loss_scale`` chooses, and ``scaling.diagnose`` of PyTorch's dynamic scaler over the
   captured steps;
3. trains the same model emulated (``precision_lab.torch.simulate``) in FP16 on the A100's FP16
   tensor-core model (``pl.tensor_core("a100", "fp16")``: every GEMM, forward and backward, through
   ``pl.gemm``), with PyTorch's dynamic loss scaler starting at the chosen scale
   (``precision_lab.torch.LossScaling``), and compares the accuracy with FP32's.

4. with ``--recipe te_mxfp8`` (any name of ``pl.quant.recipes.RECIPES``), also trains it under
   that FP4/FP8 training recipe (``plt.simulate(net, recipe)``: every GEMM's forward, input
   gradient and weight gradient quantized and accumulated as ``pl.apply_recipe`` does).

Run: ``python examples/torch_model.py`` (needs ``pip install 'precision_lab[torch]'``; about
10 s on two cores). ``--epochs``, ``--gpu``, ``--policy`` and ``--recipe`` change the run.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

import precision_lab as pl
import precision_lab.torch as plt

TOKENS, DIM, CLASSES = 8, 16, 4


class Attention(torch.nn.Module):
    """Embedding, one self-attention layer (explicit matmuls and a softmax), mean pooling, a
    linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(DIM, DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(DIM), dim=-1)
        h = self.norm(h + att @ v)
        return self.head(h.mean(dim=1))


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(DIM, CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, TOKENS, DIM, generator=g)
    return x, (x.mean(dim=1) @ teacher).argmax(dim=1)


def train(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    scaling: plt.LossScaling,
    train_set: tuple[torch.Tensor, torch.Tensor],
    epochs: int,
    capture: plt.GradientCapture | None = None,
) -> None:
    opt = torch.optim.Adam(params, lr=1e-2)
    x, y = train_set
    step = 0
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(x), 64):
            if capture is not None:
                capture.enabled = step % 10 == 0
            step += 1
            idx = order[i : i + 64]
            opt.zero_grad()
            scaling.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
            scaling.step(opt)
            scaling.update()


def accuracy(model: torch.nn.Module, test_set: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(test_set[0]).argmax(1) == test_set[1]).double().mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--gpu", default="a100", help="tensor-core model (pl.tensor_core)")
    ap.add_argument("--policy", default="mixed_float16", help="a name of pl.POLICIES")
    ap.add_argument(
        "--recipe", default=None, help="also train under this recipe (te_mxfp8, te_nvfp4 ...)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    train_set, test_set = data(1024, seed=0), data(512, seed=1)

    # 1. FP32, gradients captured every 10th step
    torch.manual_seed(0)
    net = Attention()
    with plt.capture_gradients(net, formats=("fp16", "bf16", "e4m3", "e5m2")) as cap:
        train(net, list(net.parameters()), plt.LossScaling(pl.scaling.StaticLossScaler(1.0)),
              train_set, args.epochs, capture=cap)  # fmt: skip
    acc32 = accuracy(net, test_set)
    print(f"FP32: test accuracy {100 * acc32:.2f}%; {len(cap.steps)} steps captured")

    # 2. what the formats do to those gradients, and the loss scale
    values = cap.values()
    for f in ("fp16", "bf16", "e4m3", "e5m2"):
        print("  unscaled", pl.underflow_stats(values, f).summary())
    choice = cap.pick_loss_scale("fp16", target_underflow=0.0)
    print(f"  loss scale for fp16: {choice.reason}")
    print("  PyTorch's GradScaler over the captured steps:")
    print(cap.diagnose(pl.scaling.DynamicLossScaler.preset("torch"), "fp16"))

    # 3. the same model emulated on the tensor-core model, with the chosen scale
    acc = pl.tensor_core(args.gpu, pl.get_policy(args.policy).compute_format)
    torch.manual_seed(0)
    net = Attention()
    sim = plt.simulate(net, args.policy, accumulator=acc)
    scaling = plt.LossScaling("torch", init_scale=choice.scale)
    train(sim, list(net.parameters()), scaling, train_set, args.epochs)
    acc_sim = accuracy(sim, test_set)
    print(
        f"{args.policy} on {args.gpu} ({acc.describe()}): test accuracy {100 * acc_sim:.2f}% "
        f"({100 * (acc_sim - acc32):+.2f} pp vs FP32), {int(scaling.skipped.sum())} of "
        f"{len(scaling.history)} steps skipped, final loss scale {scaling.get_scale():g}"
    )

    # 4. the same model under an FP4/FP8 training recipe (block scaling: no loss scale)
    if args.recipe is not None:
        torch.manual_seed(0)
        net = Attention()
        sim = plt.simulate(net, args.recipe, seed=0)
        train(sim, list(net.parameters()), plt.LossScaling(pl.scaling.StaticLossScaler(1.0)),
              train_set, args.epochs)  # fmt: skip
        acc_r = accuracy(sim, test_set)
        print(
            f"recipe {args.recipe}: test accuracy {100 * acc_r:.2f}% "
            f"({100 * (acc_r - acc32):+.2f} pp vs FP32)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
