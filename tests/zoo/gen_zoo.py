"""Writes the zoo's models as TorchScript files and torch.export programs
for spmd's pipeline.

  gen_zoo.py OUTDIR [--pt2] [NAME ...]

For each model of zoo.ZOO (or only those named): OUTDIR/NAME.pt, the
wrapped model (forward returns the loss) traced in train mode with
torch.jit.trace from weights seeded per model, and OUTDIR/NAME.inputs, its
--input flags. With --pt2 also, from the same weights, OUTDIR/NAME.pt2, the
model exported with torch.export.export (the training IR), and
OUTDIR/NAME.core.pt2, that program after run_decompositions() (core ATen); or,
where torch.export cannot export the model, OUTDIR/NAME.pt2.error saying why.
tests/parity/run_parity.py --zoo OUTDIR [--format pt2|core.pt2] trains them
against DDP. Run with a python that imports torch and torchvision
(/usr/bin/python3).

OUTDIR/.stamp records what made the files (this file's and zoo.py's text, the
torch and torchvision versions, the arguments): when it matches, the files are
already there and nothing is written again (make test and make test-long each
set the zoo up as a CTest fixture; the second finds it made).
"""
import hashlib
import os
import re
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo import ZOO  # noqa: E402

DTYPES = {"f32": torch.float32, "i64": torch.int64}


def example(spec):
    name, dtype, dims = re.fullmatch(r"(\w+):(\w+)\[([0-9,]*)\]", spec).groups()
    shape = [int(d) for d in dims.split(",") if d]
    return torch.randn(shape) if DTYPES[dtype].is_floating_point else torch.randint(0, 64, shape)


def write(out, names, zoo=ZOO, pt2=False):
    """Writes OUT/NAME.pt and OUT/NAME.inputs for each name of zoo (a dict of
    ZOO's shape; tests/zoo/sweep_torchvision.py passes its own), and with pt2
    OUT/NAME.pt2 and OUT/NAME.core.pt2."""
    os.makedirs(out, exist_ok=True)
    for name in names:
        constructor, specs = zoo[name]
        torch.manual_seed(zlib.crc32(name.encode()))
        model = constructor().train()
        args = tuple(example(s) for s in specs)
        traced = torch.jit.trace(model, args, check_trace=False)
        traced.save(os.path.join(out, name + ".pt"))
        # After the trace, which ran forward and so moved BatchNorm's running
        # statistics: export runs on fake tensors, so both files hold the same state.
        with open(os.path.join(out, name + ".inputs"), "w") as f:
            f.write(" ".join("--input " + s for s in specs) + "\n")
        if pt2:
            export_program(model, args, os.path.join(out, name))


def export_program(model, args, stem):
    """STEM.pt2 and STEM.core.pt2; where this torch cannot export the model,
    STEM.pt2.error instead, one line saying why (run_parity.py expects it only
    for the models it lists)."""
    try:
        program = torch.export.export(model, args)
    except Exception as e:  # torch's own refusal: recorded, not ours to fix
        with open(stem + ".pt2.error", "w") as f:
            f.write(f"torch {torch.__version__}: {type(e).__name__}: {str(e).strip().splitlines()[0]}\n")
        return
    torch.export.save(program, stem + ".pt2")
    torch.export.save(program.run_decompositions(), stem + ".core.pt2")


def stamp_of(names, pt2):
    """What the files written for names depend on, as one hex digest."""
    import torchvision
    h = hashlib.sha256()
    for source in (__file__, sys.modules["zoo"].__file__):
        with open(source, "rb") as f:
            h.update(f.read())
    h.update(f"torch {torch.__version__} torchvision {torchvision.__version__} pt2 {pt2} {' '.join(names)}".encode())
    return h.hexdigest()


def written(out, names, pt2):
    """Whether every file of names is in out (a .pt2.error counts for the programs)."""
    def has(name, ext):
        return os.path.exists(os.path.join(out, name + ext))
    return all(has(n, ".pt") and has(n, ".inputs") and
               (not pt2 or has(n, ".pt2.error") or (has(n, ".pt2") and has(n, ".core.pt2"))) for n in names)


def main(argv):
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    pt2 = "--pt2" in argv
    argv = [a for a in argv if a != "--pt2"]
    out, names = argv[0], argv[1:] or sorted(ZOO)
    stamp, stamp_file = stamp_of(names, pt2), os.path.join(out, ".stamp")
    if os.path.exists(stamp_file) and open(stamp_file).read().strip() == stamp and written(out, names, pt2):
        print(f"{len(names)} models in {out} are up to date")
        return 0
    if os.path.exists(stamp_file):
        os.remove(stamp_file)
    write(out, names, pt2=pt2)
    with open(stamp_file, "w") as f:
        f.write(stamp + "\n")
    print(f"wrote {len(names)} models to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
