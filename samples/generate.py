"""Regenerates samples/*.pt2, samples/*.pt and samples/*.inputs.

Usage: /usr/bin/python3 samples/generate.py [OUTDIR] [--pt2-only]   (default: the samples folder)
Each model is scripted with torch.jit.script and saved with torch.jit.save; its
`.inputs` file holds the `--input` flags that the CLI stages take for it. The
same model, with the TorchScript file's weights, is exported with
torch.export.export and saved with torch.export.save as NAME.pt2, whose input
shapes come with it. --pt2-only writes only the .pt2 files, from the .pt files
already in OUTDIR.
"""
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import SAMPLES  # noqa: E402


def example(spec):
    name, dtype, dims = re.fullmatch(r"(\w+):(\w+)\[([0-9,]*)\]", spec).groups()
    shape = [int(d) for d in dims.split(",") if d]
    return torch.randn(shape) if dtype.startswith("f") else torch.randint(0, 16, shape)


def export_programs(out):
    """NAME.pt2 of each sample, with the weights of OUT/NAME.pt."""
    torch.manual_seed(0)
    for name, (make, specs) in SAMPLES.items():
        model = make()
        state = model.state_dict()
        state.update(torch.jit.load(os.path.join(out, name + ".pt"), map_location="cpu").state_dict())
        model.load_state_dict(state, strict=True)
        program = torch.export.export(model.train(), tuple(example(s) for s in specs))
        torch.export.save(program, os.path.join(out, name + ".pt2"))
        print("wrote", os.path.join(out, name + ".pt2"))


def main():
    args = [a for a in sys.argv[1:] if a != "--pt2-only"]
    out = args[0] if args else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    if "--pt2-only" in sys.argv:
        export_programs(out)
        return
    for name, (make, specs) in SAMPLES.items():
        torch.manual_seed(0)
        module = torch.jit.script(make().train())
        module.save(os.path.join(out, name + ".pt"))
        with open(os.path.join(out, name + ".inputs"), "w") as f:
            f.write(" ".join("--input " + s for s in specs) + "\n")
        print("wrote", os.path.join(out, name + ".pt"))
    export_programs(out)


if __name__ == "__main__":
    main()
