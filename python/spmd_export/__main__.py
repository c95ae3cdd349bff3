"""python3 -m spmd_export MODULE:FUNCTION [-o step.json] [--weights step.weights.pt] [--format json|pt2]

FUNCTION (in an importable module, or a .py file path) takes no arguments and
returns (train_step, model, optimizer, batch), the arguments of
spmd_export.export. With --format json (the default) the whole train step is
traced with make_fx and written as spmd's JSON graph dump (-o) and weights
(--weights), which spmd-split reads. With --format pt2 only the model's
forward on the batch, which must return the loss, is exported with
torch.export and written as a .pt2 (-o, default model.pt2), which spmd-expand
reads and gives the optimizer its flags name (train_step and optimizer are
not used).

Every failure is one line on stderr, `spmd_export: error: ...`, with exit
status 1 (2 for a bad command line), never a traceback: the user's code that
raised is named by file and line instead.
"""
import argparse
import importlib
import importlib.util
import os
import sys

from ._export import SpmdExportError, describe, export, export_program


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
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the user's file failed to run (SyntaxError included)
            raise SpmdExportError(f"cannot load {module_name}: {describe(e)}") from None
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise SpmdExportError(f"cannot import {module_name}: {e}") from None
        except Exception as e:
            raise SpmdExportError(f"cannot import {module_name}: {describe(e)}") from None
    if not hasattr(module, function):
        raise SpmdExportError(f"{module_name} has no function {function!r}")
    return getattr(module, function)


def _arguments(target):
    """(train_step, model, optimizer, batch) from the user's function."""
    make = _load(target)
    try:
        made = make()
    except Exception as e:
        raise SpmdExportError(f"{target} raised {describe(e)}") from None
    if not isinstance(made, (tuple, list)) or len(made) != 4:
        got = f"{len(made)} values" if isinstance(made, (tuple, list)) else type(made).__name__
        raise SpmdExportError(f"{target} must return (train_step, model, optimizer, batch), got {got}")
    return made


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, as for every other failure; exit 2 marks a usage error.
        print(f"spmd_export: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    parser = _Parser(prog="python3 -m spmd_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="MODULE:FUNCTION returning (train_step, model, optimizer, batch)")
    parser.add_argument("-o", "--output", help="file to write (default step.json, or model.pt2 with --format pt2)")
    parser.add_argument("--weights", help="torch.save file for parameters and state (default: OUTPUT with .weights.pt)")
    parser.add_argument("--format", choices=["json", "pt2"], default="json",
                        help="json: the train step as spmd's graph dump; pt2: the model's loss as a torch.export program")
    args = parser.parse_args(argv)
    if args.format == "pt2" and args.weights:
        parser.error("--weights is for --format json: a .pt2 holds its weights")
    args.output = args.output or ("model.pt2" if args.format == "pt2" else "step.json")
    try:
        if args.format == "pt2":
            _, model, _, batch = _arguments(args.target)
            export_program(model, batch, args.output)
        else:
            export(*_arguments(args.target), args.output, args.weights)
    except SpmdExportError as e:
        print("spmd_export: error: " + " ".join(str(e).splitlines()), file=sys.stderr)
        return 1
    except Exception as e:  # export() names every cause it knows; anything else is still one line
        print(f"spmd_export: error: internal error (please report): {describe(e, skip_ours=False)}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
