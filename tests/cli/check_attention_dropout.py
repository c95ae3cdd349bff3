"""Attention dropout (F.scaled_dot_product_attention's dropout_p) trains
through spmd's pipeline on the CPU with the semantics of eager PyTorch's.

PyTorch's own nn.TransformerEncoderLayer (dropout 0.1: its attention calls
SDPA with dropout_p 0.1 in training) under a regression loss goes through
spmd-expand | spmd-split | spmd-lower and trains 8 steps of Adam on 2 ranks.
Checked: every SDPA call became spmd::attention with its dropout and a keep
mask drawn in the step (aten::rand), none is left to SDPA's math; runs with
the same --seed give the same losses, another seed other losses; and each
run's losses stay within 25% of eager PyTorch's training of the same model
on the same batches (its own masks: other draws, the same probabilities).

  check_attention_dropout.py BIN_DIR   (run from the repository root; python3 with torch)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

BIN = sys.argv[1]
TMP = tempfile.mkdtemp()
STEPS, ROWS, SEQ, DIM = 8, 8, 16, 32  # ROWS a rank; 2 ranks


class EncoderRegression(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(DIM, 4, 2 * DIM, dropout=0.1, batch_first=True)
        self.head = nn.Linear(DIM, 1)

    def forward(self, x, y):
        return ((self.head(self.layer(x)) - y) ** 2).mean()


def tool(name):
    return os.path.join(BIN, name)


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, check=True).stdout


def train_spmd(step, seed):
    artifact = os.path.join(TMP, "step.art")
    run([tool("spmd-lower"), "-", "--device", "cpu", "-o", artifact], stdin=step)
    out = run([tool("spmd-run"), artifact, "--nproc", "2", "--steps", str(STEPS), "--json", "--seed", str(seed),
               "--data", os.path.join(TMP, "data.pt")])
    return json.loads(out)["losses"]


def train_eager(model, data):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = model(data["x"][s], data["y"][s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    torch.manual_seed(0)
    model = EncoderRegression().train()
    g = torch.Generator().manual_seed(1)
    data = {"x": torch.randn(STEPS, 2 * ROWS, SEQ, DIM, generator=g),
            "y": torch.randn(STEPS, 2 * ROWS, SEQ, 1, generator=g)}
    torch.save(data, os.path.join(TMP, "data.pt"))
    path = os.path.join(TMP, "model.pt")
    # check_trace=False: dropout makes a second run differ, by design.
    torch.jit.trace(model, (data["x"][0][:ROWS], data["y"][0][:ROWS]), check_trace=False).save(path)
    step = run([tool("spmd-expand"), path, "--input", f"x:f32[{ROWS},{SEQ},{DIM}]", "--input",
                f"y:f32[{ROWS},{SEQ},1]", "--optimizer", "adam", "--lr", "1e-3"])
    step = run([tool("spmd-split")], stdin=step)
    listing = run([tool("spmd-inspect"), "-"], stdin=step).decode()
    problems = []
    attentions = re.findall(r"= spmd::attention\((.*)\)", listing)
    if len(attentions) != 1 or ", 0.1, %" not in attentions[0] or "aten::rand(" not in listing:
        problems.append(f"expected one spmd::attention with dropout 0.1 and a drawn keep mask: {attentions}")
    if "aten::scaled_dot_product_attention" in listing or "_safe_softmax" in listing:
        problems.append("an SDPA call was left to its math")
    first, again, other = train_spmd(step, 3), train_spmd(step, 3), train_spmd(step, 4)
    eager = train_eager(model, data)
    if first != again:
        problems.append(f"the same --seed gave other losses: {first} and {again}")
    if first == other:
        problems.append("another --seed gave the same losses")
    for name, losses in (("seed 3", first), ("seed 4", other)):
        if len(losses) != STEPS or any(abs(a - b) > 0.25 * abs(b) for a, b in zip(losses, eager)):
            problems.append(f"{name}: losses {losses} not within 25% of eager PyTorch's {eager}")
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print(f"PASS attention dropout on a drawn keep mask; {STEPS} steps on 2 ranks: {first[0]:.4f} -> "
              f"{first[-1]:.4f} (eager {eager[0]:.4f} -> {eager[-1]:.4f})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
