"""Regenerates samples/*.pt and samples/*.inputs.

Usage: /usr/bin/python3 samples/generate.py [OUTDIR]   (default: the samples folder)
Each model is scripted with torch.jit.script and saved with torch.jit.save; its
`.inputs` file holds the `--input` flags that the CLI stages take for it.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import SAMPLES  # noqa: E402


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    for name, (make, specs) in SAMPLES.items():
        torch.manual_seed(0)
        module = torch.jit.script(make().train())
        module.save(os.path.join(out, name + ".pt"))
        with open(os.path.join(out, name + ".inputs"), "w") as f:
            f.write(" ".join("--input " + s for s in specs) + "\n")
        print("wrote", os.path.join(out, name + ".pt"))


if __name__ == "__main__":
    main()
