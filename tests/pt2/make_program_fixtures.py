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
  along its vmap (the expanded case);
- experts: a mixture of experts routed as transformers routes its grouped_mm
  experts, through transformers' custom op grouped_mm_fallback (defined here
  under its name and schema); experts_aten, the same with ATen's _grouped_mm
  (in bf16, as the CPU takes it), written without an oracle, and as a
  TorchScript trace too (experts_aten.pt): check_pt2.py checks that both
  are read.

  make_program_fixtures.py OUTDIR [NAME ...]     (all when none is named)

For each NAME: OUTDIR/NAME.pt2, the program; with an oracle, NAME.data.pt, 2 steps' batches
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


@torch.library.custom_op("transformers::grouped_mm_fallback", mutates_args=())
def grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """transformers' own grouped GEMM (integrations/moe.py), under its name and schema."""
    out = input.new_zeros(input.size(0), weight.size(2))
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = input[start:end] @ weight[e]
        start = end
    return out


@grouped_mm_fallback.register_fake
def _(input, weight, offs):
    return input.new_empty(input.size(0), weight.size(2))


def _grouped_mm_fallback_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    grad_input, grad_weight = torch.zeros_like(input), torch.zeros_like(weight)
    start = 0
    for e, end in enumerate(ctx.offs.tolist()):
        grad_input[start:end] = grad[start:end] @ weight[e].T
        grad_weight[e] = input[start:end].T @ grad[start:end]
        start = end
    return grad_input, grad_weight, None


def _grouped_mm_fallback_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


grouped_mm_fallback.register_autograd(_grouped_mm_fallback_backward, setup_context=_grouped_mm_fallback_context)


class Experts(nn.Module):
    """A mixture of 4 experts, 2 a token, routed as transformers' grouped_mm
    experts route (sort by expert, histc, cumsum offsets), through
    transformers' custom op; with `aten`, through ATen's _grouped_mm instead
    (which takes bf16 only on the CPU)."""

    def __init__(self, aten=False):
        super().__init__()
        self.aten = aten
        self.router = nn.Linear(8, 4)
        self.up = nn.Parameter(torch.randn(4, 8, 16) * 0.3)
        self.down = nn.Parameter(torch.randn(4, 16, 8) * 0.3)

    def forward(self, x, y):
        weights, experts = torch.topk(self.router(x).softmax(-1), 2)
        ids, order = torch.sort(experts.reshape(-1))
        rows = x[order // 2]
        offs = torch.cumsum(torch.histc(ids.float(), bins=4, min=0, max=3), 0, dtype=torch.int32)
        def grouped(a, w):
            if self.aten:
                return torch._grouped_mm(a.bfloat16(), w.bfloat16(), offs).float()
            return grouped_mm_fallback(a, w, offs)

        out = grouped(F.gelu(grouped(rows, self.up)), self.down) * weights.reshape(-1)[order].unsqueeze(-1)
        mixed = torch.zeros_like(x).index_add(0, order // 2, out)
        return F.mse_loss(mixed, y)


# name: (model, what its program must hold, whether eager's training is
# written beside it, whether a TorchScript trace is too)
FIXTURES = {
    "no_grad": (NoGradBlock, "wrap_with_set_grad_enabled", True, False),
    "vmap": (VmapMask, "_vmap_increment_nesting", True, False),
    "experts": (Experts, "grouped_mm_fallback", True, False),
    "experts_aten": (lambda: Experts(aten=True), "_grouped_mm", False, True),
}


def write(out, name):
    make, marker, oracle, traced = FIXTURES[name]
    torch.manual_seed(0)
    model = make()
    data = {"x": torch.randn(2, 4, 8), "y": torch.randn(2, 4, 8)}
    program = torch.export.export(model, (data["x"][0], data["y"][0]))
    if not any(marker in str(n.target) for n in program.graph.nodes):
        sys.exit(f"make_program_fixtures.py: error: torch {torch.__version__} exports no {marker} for {name}")
    torch.export.save(program, os.path.join(out, name + ".pt2"))
    if traced:
        torch.jit.trace(model, (data["x"][0], data["y"][0])).save(os.path.join(out, name + ".pt"))
    if not oracle:
        return
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
