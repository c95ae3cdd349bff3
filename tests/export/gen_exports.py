"""Exports the samples' train steps with spmd_export and records PyTorch's own
eager training of the same models as the oracle.

  gen_exports.py OUTDIR      (with python/ and samples/ importable)

For each case OUTDIR gets NAME.json + NAME.weights.pt (the export) and
NAME.expected.pt: {"batches": {input: [S, ...]}, "losses": [S],
"params": {name: after S steps}, "buffers": {name: after S steps}}; and
manifest.json lists the cases.
"""
import copy
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "samples"), os.path.join(ROOT, "tests", "zoo")]

import spmd_export  # noqa: E402
from models import MLP, TinyCNN, TinyLM  # noqa: E402
from zoo import ZOO, NanoGPTLoss  # noqa: E402

STEPS = 5


def train_step(model, optimizer, batch):
    loss = model(*batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def mlp_batch(rows, width):
    return lambda g: (torch.randn(rows, width, generator=g),)


def lm_batch(g):
    return torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def cnn_batch(g):
    return torch.randn(8, 3, 16, 16, generator=g), torch.randn(8, 4, generator=g)


def image_batch(g):
    """Two 32 x 32 images and their classes, as tests/zoo's classifiers take them."""
    return torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 64, (2,), generator=g)


def tied_mlp():
    """Linear, Tanh, Linear sharing one weight, then MLP(1, 32), whose forward
    sums to the loss."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), MLP(1, 32))
    model[2].weight = model[0].weight
    return model


class ViewWrites(torch.nn.Module):
    """Writes through views: the input copied into a slice of a fresh tensor
    that is then read whole, and a buffer counted up through a slice of it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(40, 40)
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x):
        wide = x.new_zeros(x.shape[0], 40)
        wide[:, 4:36] = x
        self.seen[1:].add_(1.0)
        return self.linear(wide).pow(2).mean()


def nanogpt_adamw(**kwargs):
    """nanoGPT's configure_optimizers: weight decay 0.1 on the matrices (the
    tied wte/lm_head among them) and none on biases and norms, betas (0.9,
    0.95); eps 1e-5, as the LM cases' (see CASES)."""
    def make(params):
        params = list(params)
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-5, **kwargs)
    return make


# name -> (model, optimizer, one batch from a generator). The exported update
# is PyTorch's tensor-step Adam formulation, which rounds differently from the
# default one; parameters whose gradient is pure rounding noise (attention's key
# bias, a conv bias before BatchNorm) then drift apart at the scale lr * g / eps,
# so the LM case uses an eps that keeps that drift below the tolerance.
CASES = {
    "mlp_adam": (lambda: MLP(), lambda ps: torch.optim.Adam(ps, lr=1e-2), mlp_batch(100, 100)),
    "lm_adamw": (lambda: TinyLM(), lambda ps: torch.optim.AdamW(ps, lr=1e-2, eps=1e-5), lm_batch),
    "cnn_sgd": (lambda: TinyCNN(), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), cnn_batch),
    "mlp_sgd_nesterov_wd": (lambda: MLP(3, 32),
                            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-3),
                            mlp_batch(7, 32)),
    "mlp_adam_amsgrad_wd": (lambda: MLP(4, 24), lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, weight_decay=1e-2),
                            mlp_batch(9, 24)),
    # torch.optim's multi-tensor (foreach) implementations, the default on
    # CUDA, against eager foreach training: the export expands each _foreach_
    # op into per-tensor ops (zero_grad's _foreach_zero_ too). Adam/AdamW are
    # traced through their tensor-step (capturable) foreach path, which rounds
    # as the tensor-step single-tensor one does (see above).
    "mlp_sgd_foreach": (lambda: MLP(3, 32), lambda ps: torch.optim.SGD(ps, lr=0.05, foreach=True), mlp_batch(7, 32)),
    "cnn_sgd_foreach": (lambda: TinyCNN(), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
                        cnn_batch),
    "mlp_sgd_nesterov_wd_foreach": (lambda: MLP(3, 32),
                                    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True,
                                                               weight_decay=1e-3, foreach=True),
                                    mlp_batch(7, 32)),
    "mlp_adam_foreach": (lambda: MLP(), lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True), mlp_batch(100, 100)),
    "lm_adamw_foreach": (lambda: TinyLM(), lambda ps: torch.optim.AdamW(ps, lr=1e-2, eps=1e-5, foreach=True), lm_batch),
    "mlp_adam_amsgrad_wd_foreach": (lambda: MLP(4, 24),
                                    lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, weight_decay=1e-2,
                                                                foreach=True),
                                    mlp_batch(9, 24)),
    # Weights shared by two modules (the LM's head and token embedding,
    # nanoGPT's lm_head and wte, tied_mlp's layers) are one parameter input,
    # whose gradient sums both uses.
    "tied_mlp_sgd": (tied_mlp, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), mlp_batch(7, 32)),
    "lm_adamw_wd_no_foreach": (lambda: TinyLM(),
                               lambda ps: torch.optim.AdamW(ps, lr=1e-2, eps=1e-5, weight_decay=0.1, foreach=False),
                               lm_batch),
    # nanoGPT (SDPA, tied wte/lm_head) as its train.py trains it: AdamW with
    # two param groups, foreach, and fused as it picks on CUDA (traced as
    # foreach).
    "nanogpt_adamw_foreach": (lambda: NanoGPTLoss(), nanogpt_adamw(foreach=True), lm_batch),
    "nanogpt_adamw_fused": (lambda: NanoGPTLoss(), nanogpt_adamw(fused=True), lm_batch),
    # Writes through views give the viewed tensor its new value: the user's
    # (ViewWrites), and autograd's own in convnext's backward (a gradient
    # written into a fresh buffer through as_strided).
    "view_writes_adam": (ViewWrites, lambda ps: torch.optim.Adam(ps, lr=1e-2), mlp_batch(7, 32)),
    "convnext_sgd_foreach": (ZOO["convnext"][0], lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
                             image_batch),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    manifest = []
    for name, (make_model, make_opt, make_batch) in CASES.items():
        torch.manual_seed(0)
        model = make_model().train()
        reference = copy.deepcopy(model)
        g = torch.Generator().manual_seed(11)
        data = [make_batch(g) for _ in range(STEPS)]
        dump = os.path.join(out, name + ".json")
        spmd_export.export(train_step, model, make_opt(model.parameters()), data[0], dump)

        opt = make_opt(reference.parameters())
        losses = [train_step(reference, opt, b).detach() for b in data]
        names = [f"input{i}" for i in range(len(data[0]))]
        expected = {
            "batches": {n: torch.stack([b[i] for b in data]) for i, n in enumerate(names)},
            "losses": torch.stack(losses),
            "params": {n: p.detach().clone() for n, p in reference.named_parameters()},
            "buffers": {n: b.detach().clone() for n, b in reference.named_buffers()},
        }
        torch.save(expected, os.path.join(out, name + ".expected.pt"))
        manifest.append({"name": name, "dump": name + ".json", "expected": name + ".expected.pt", "steps": STEPS})
        print("exported", name)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
