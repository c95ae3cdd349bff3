"""A step whose dropout masks are drawn in generated kernels trains through
spmd-lower and spmd-run (issue #15, dropout-mask-in-kernel).

An MLP with dropout p = 0.2 after each ReLU goes through spmd-expand and
spmd-opt's dropout-mask-in-kernel and fuse-pointwise (which spmd-lower runs only for
CUDA), is lowered for the CPU, where its spmd::fused nodes run their
reference kernel, and trains 8 steps on 2 ranks. Checked: no mask is left
to ATen's bernoulli and every seed feeds two kernels (the forward's and the
backward's product); runs with the same --seed give the same losses, another
seed other losses; each run's losses stay within 25% of the unfused step's
(which draws its masks with ATen's bernoulli: other masks, the same
probabilities).

  check_dropout_step.py BIN_DIR   (run from the repository root; python3 with torch)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "samples"))
from models import DropoutMLP  # noqa: E402

BIN = sys.argv[1]
TMP = tempfile.mkdtemp()


def tool(name):
    return os.path.join(BIN, name)


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, check=True).stdout


def train(graph, name, seed):
    artifact = os.path.join(TMP, name + ".art")
    run([tool("spmd-lower"), "-", "--device", "cpu", "-o", artifact], stdin=graph)
    out = run([tool("spmd-run"), artifact, "--nproc", "2", "--steps", "8", "--json", "--seed", str(seed),
               "--data", os.path.join(TMP, "data.pt")])
    return json.loads(out)["losses"]


def main():
    torch.manual_seed(0)
    model = os.path.join(TMP, "dropout_mlp.pt")
    torch.jit.script(DropoutMLP(dim=64, layers=3, p=0.2).train()).save(model)
    g = torch.Generator().manual_seed(1)  # 2 ranks of 32 rows
    torch.save({"x": torch.randn(8, 64, 64, generator=g), "y": torch.randn(8, 64, 1, generator=g)},
               os.path.join(TMP, "data.pt"))
    step = run([tool("spmd-expand"), model, "--input", "x:f32[32,64]", "--input", "y:f32[32,1]",
                "--optimizer", "adam", "--lr", "0.01"])
    step = run([tool("spmd-split")], stdin=step)
    fused = run([tool("spmd-opt"), "-", "--passes", "dropout-mask-in-kernel,fuse-pointwise"], stdin=step).decode()
    problems = []
    seeds = re.findall(r"%(\S+): i64\[\] = spmd::dropout_seed", fused)
    if len(seeds) != 3 or "aten::bernoulli" in fused:
        problems.append(f"{len(seeds)} dropout seeds (expected 3), bernoulli left: {'aten::bernoulli' in fused}")
    for s in seeds:
        readers = len(re.findall(r"spmd::fused\(\[%" + re.escape(s) + r",", fused))
        if readers != 2:
            problems.append(f"seed {s} read by {readers} generated kernels, expected 2")
    plain = train(step, "plain", 3)
    first, again, other = train(fused.encode(), "fused", 3), train(fused.encode(), "fused", 3), train(fused.encode(), "fused", 4)
    if first != again:
        problems.append(f"the same --seed gave other losses: {first} and {again}")
    if first == other:
        problems.append("another --seed gave the same losses")
    for name, losses in (("seed 3", first), ("seed 4", other)):
        if len(losses) != 8 or any(abs(a - b) > 0.25 * abs(b) for a, b in zip(losses, plain)):
            problems.append(f"{name}: losses {losses} not within 25% of the unfused step's {plain}")
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print(f"PASS {len(seeds)} masks drawn in kernels; 8 steps on 2 ranks: {first[0]:.4f} -> {first[-1]:.4f} "
              f"(unfused {plain[0]:.4f} -> {plain[-1]:.4f})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
