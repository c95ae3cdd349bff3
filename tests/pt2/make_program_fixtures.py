"""Writes the fixtures of tests/pt2/fixtures that need a newer torch.export
than CI's (torch >= 2.8: Debian unstable's python3-torch), with their oracles:

- no_grad: a `torch.no_grad()` block, which torch.export (2.7 and later)
  records as the higher-order op wrap_with_set_grad_enabled, as
  transformers' rotary embeddings have it: cos/sin-like values from a buffer
  and a scale read from a parameter without its gradient;
- vmap: an attention mask made by per-position functions under torch.vmap,
  as transformers' create_causal_mask makes it when a model passes a mask
  function of its own (Falcon, Gemma 3): the program keeps the vmap as
  torch._functorch.predispatch calls. One function's result does not vary
  along its vmap (the expanded case).

  make_program_fixtures.py OUTDIR [NAME ...]     (all when none is named)

For each NAME: OUTDIR/NAME.pt2, the program; NAME.data.pt, 2 steps' batches
{x, y}; NAME.expected.pt, the parameters after 2 steps of
torch.optim.SGD(lr=0.1) in eager PyTorch on those batches (check_pt2.py
trains the program with spmd and compares).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class NoGradBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("inv_freq", torch.rand(4))

    def forward(self, x, y):
        with torch.no_grad():
            freqs = torch.outer(torch.arange(8.0), self.inv_freq)
            scale = self.lin.weight.abs().mean() + 1  # no gradient reaches lin.weight through here
        h = self.lin(x) * freqs.cos().sum() * scale
        return F.mse_loss(h, y)


class VmapMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)

    def forward(self, x, y):
        t = x.shape[0]
        positions = torch.arange(t)

        def allowed(q, k):  # causal, 3 keys wide
            return (k <= q) & (q - k < 3)

        mask = torch.vmap(torch.vmap(allowed, in_dims=(None, 0)), in_dims=(0, None))(positions, positions)
        every = torch.vmap(lambda k: torch.ones((), dtype=torch.bool))(positions)
        q, k, v = self.qkv(x).view(t, 3, 2, 4).permute(1, 2, 0, 3)  # 2 heads of 4
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & every[None, :])
        return F.mse_loss(self.out(h.transpose(0, 1).reshape(t, 8)), y)


# name: (model, what its program must hold)
FIXTURES = {
    "no_grad": (NoGradBlock, "wrap_with_set_grad_enabled"),
    "vmap": (VmapMask, "_vmap_increment_nesting"),
}


def write(out, name):
    make, marker = FIXTURES[name]
    torch.manual_seed(0)
    model = make()
    data = {"x": torch.randn(2, 4, 8), "y": torch.randn(2, 4, 8)}
    program = torch.export.export(model, (data["x"][0], data["y"][0]))
    if not any(marker in str(n.target) for n in program.graph.nodes):
        sys.exit(f"make_program_fixtures.py: error: torch {torch.__version__} exports no {marker} for {name}")
    torch.export.save(program, os.path.join(out, name + ".pt2"))
    torch.save(data, os.path.join(out, name + ".data.pt"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(2):
        opt.zero_grad()
        model(data["x"][s], data["y"][s]).backward()
        opt.step()
    torch.save({n: p.detach() for n, p in model.named_parameters()}, os.path.join(out, name + ".expected.pt"))


if __name__ == "__main__":
    for fixture in sys.argv[2:] or FIXTURES:
        write(sys.argv[1], fixture)
