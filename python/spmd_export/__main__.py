"""python3 -m spmd_export MODULE:FUNCTION [-o step.json] [--weights step.weights.pt]

FUNCTION (in an importable module, or a .py file path) takes no arguments and
returns (train_step, model, optimizer, batch), the arguments of
spmd_export.export.
"""
import argparse
import importlib
import importlib.util
import os
import sys

from ._export import SpmdExportError, export


def _load(target):
    module_name, _, function = target.rpartition(":")
    if not module_name or not function:
        raise SpmdExportError(f"expected MODULE:FUNCTION or FILE.py:FUNCTION, got {target!r}")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(module_name))[0], module_name)
        if spec is None or not os.path.exists(module_name):
            raise SpmdExportError(f"{module_name}: no such file")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(module_name)))
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise SpmdExportError(f"cannot import {module_name}: {e}") from None
    if not hasattr(module, function):
        raise SpmdExportError(f"{module_name} has no function {function!r}")
    return getattr(module, function)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m spmd_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="MODULE:FUNCTION returning (train_step, model, optimizer, batch)")
    parser.add_argument("-o", "--output", default="step.json", help="JSON graph dump to write (default step.json)")
    parser.add_argument("--weights", help="torch.save file for parameters and state (default: OUTPUT with .weights.pt)")
    args = parser.parse_args(argv)
    try:
        train_step, model, optimizer, batch = _load(args.target)()
        export(train_step, model, optimizer, batch, args.output, args.weights)
    except SpmdExportError as e:
        print(f"spmd_export: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
