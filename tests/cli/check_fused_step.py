"""A step with generated kernels trains as the step without them (issue #15).

The LM sample's bf16 step (CPU autocast policy) goes through spmd-opt's
fuse-pointwise, which spmd-lower runs only for CUDA; lowered for the CPU, its
spmd::fused nodes run their reference kernel (the program evaluated with
ATen). Both artifacts train 6 steps on 2 ranks; the losses and the saved
parameters must agree. Not bit for bit: ATen's CPU add with alpha may round
once (a fused multiply-add) where the program rounds its multiply and its add.

  check_fused_step.py BIN_DIR   (run from the repository root; python3 with torch)
"""
import json
import os
import subprocess
import sys
import tempfile

import torch

BIN = sys.argv[1]
TMP = tempfile.mkdtemp()


def tool(name):
    return os.path.join(BIN, name)


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, check=True).stdout


def train(graph, name):
    artifact, params = os.path.join(TMP, name + ".art"), os.path.join(TMP, name + ".pt")
    run([tool("spmd-lower"), "-", "--device", "cpu", "-o", artifact], stdin=graph)
    out = run([tool("spmd-run"), artifact, "--nproc", "2", "--json", "--save-params", params])
    return json.loads(out)["losses"], torch.load(params)


def main():
    with open("samples/lm.inputs") as f:
        inputs = f.read().split()
    step = run([tool("spmd-expand"), "samples/lm.pt", *inputs, "--optimizer", "adamw", "--autocast", "cpu:bf16"])
    step = run([tool("spmd-unroll"), "--iters", "6"], stdin=run([tool("spmd-split")], stdin=step))
    fused = run([tool("spmd-opt"), "-", "--passes", "fuse-pointwise"], stdin=step)
    kernels = json.loads(run([tool("spmd-inspect"), "-", "--kernels", "--json"], stdin=fused))
    problems = []
    # The forward's and backward's groups; the optimizer's first moment is one
    # lerp (as torch.optim's), a single op, which stays as it is.
    if len(kernels) < 4:
        problems.append(f"fuse-pointwise made {len(kernels)} kernels, expected at least 4")
    plain_losses, plain = train(step, "plain")
    fused_losses, ours = train(fused, "fused")
    if len(plain_losses) != 6 or len(fused_losses) != 6:
        problems.append(f"losses per step: {plain_losses} and {fused_losses}")
    elif not torch.allclose(torch.tensor(fused_losses), torch.tensor(plain_losses), rtol=1e-5, atol=0):
        problems.append(f"losses differ: {fused_losses} against {plain_losses}")
    if sorted(ours) != sorted(plain):
        problems.append("the saved parameters have other names")
    for name in sorted(plain):
        if not torch.allclose(ours[name], plain[name], rtol=1e-5, atol=1e-6):
            diff = (ours[name] - plain[name]).abs().max().item()
            problems.append(f"parameter {name} differs by up to {diff:.3g}")
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print(f"PASS {len(kernels)} generated kernels; 6 steps on 2 ranks agree (final loss {fused_losses[-1]:.6f})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
