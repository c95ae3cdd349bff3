"""Writes tests/pt2/fixtures/no_grad.pt2 and its oracle: a model with a
`torch.no_grad()` block, which torch.export (2.7 and later) records as the
higher-order op wrap_with_set_grad_enabled, as transformers' rotary
embeddings have it: cos/sin-like values from a buffer and a scale read from a
parameter without its gradient.

  make_no_grad_fixture.py OUTDIR      (torch >= 2.7: Debian unstable's python3-torch)

OUTDIR/no_grad.pt2, the program; no_grad.data.pt, 2 steps' batches
{x, y}; no_grad.expected.pt, the parameters after 2 steps of
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


def main(out):
    torch.manual_seed(0)
    model = NoGradBlock()
    data = {"x": torch.randn(2, 4, 8), "y": torch.randn(2, 4, 8)}
    program = torch.export.export(model, (data["x"][0], data["y"][0]))
    if not any("wrap_with_set_grad_enabled" in str(n.target) for n in program.graph.nodes):
        sys.exit(f"make_no_grad_fixture.py: error: torch {torch.__version__} exports no wrap_with_set_grad_enabled")
    torch.export.save(program, os.path.join(out, "no_grad.pt2"))
    torch.save(data, os.path.join(out, "no_grad.data.pt"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(2):
        opt.zero_grad()
        model(data["x"][s], data["y"][s]).backward()
        opt.step()
    torch.save({n: p.detach() for n, p in model.named_parameters()}, os.path.join(out, "no_grad.expected.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
