"""Writes .pt2 files of the samples (samples/models.py, with the weights of
samples/NAME.pt) for spmd's tests.

  make_fixtures.py OUTDIR

For each sample NAME: OUTDIR/NAME.pt2, the model exported with
torch.export.export (the training IR), and OUTDIR/NAME.core.pt2, that program
after run_decompositions() (core ATen); and OUTDIR/lm.dynamic.pt2, the LM
exported with a symbolic batch size. The committed files in tests/pt2/fixtures
were written by torch 2.14 (Debian unstable's python3-torch) in the PT2
archive layout, which CI's torch 2.6 cannot write; tests/pt2/run_pt2.py also
runs this script with CI's torch for the flat layout of torch 2.6 and 2.7.
"""
import os
import re
import sys
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "samples"))
from models import SAMPLES  # noqa: E402

DTYPES = {"f32": torch.float32, "i64": torch.int64}


def example(spec):
    name, dtype, dims = re.fullmatch(r"(\w+):(\w+)\[([0-9,]*)\]", spec).groups()
    shape = [int(d) for d in dims.split(",") if d]
    return torch.randn(shape) if DTYPES[dtype].is_floating_point else torch.randint(0, 16, shape)


def model_of(name):
    """The eager sample with the TorchScript sample's weights and buffers."""
    model = SAMPLES[name][0]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated from torch 2.10 on
        scripted = torch.jit.load(os.path.join(ROOT, "samples", name + ".pt"), map_location="cpu")
    state = model.state_dict()
    state.update(scripted.state_dict())
    model.load_state_dict(state, strict=True)
    return model.train()


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = argv[0]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for name, (_, specs) in SAMPLES.items():
        model = model_of(name)
        args = tuple(example(s) for s in specs)
        program = torch.export.export(model, args)
        torch.export.save(program, os.path.join(out, name + ".pt2"))
        torch.export.save(program.run_decompositions(), os.path.join(out, name + ".core.pt2"))
    batch = torch.export.Dim("batch", min=2, max=64)
    model = model_of("lm")
    args = tuple(example(s) for s in SAMPLES["lm"][1])
    program = torch.export.export(model, args, dynamic_shapes={"tokens": {0: batch}, "targets": {0: batch}})
    torch.export.save(program, os.path.join(out, "lm.dynamic.pt2"))
    print(f"wrote {len(SAMPLES) * 2 + 1} programs to {out} (torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
