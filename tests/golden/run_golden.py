"""Golden-file tests for the spmd tools' text outputs.

cases.txt holds one case per line: `EXPECTED-FILE TOOL ARGS... [| TOOL ARGS...]`,
run from the repository root with each TOOL taken from --bin-dir and the stages
piped together as a shell would. A case names a samples input file with
@samples/X.inputs to splice in its --input flags.

  run_golden.py --bin-dir build [--case EXPECTED-FILE] [--update]

Without --update a case passes when the tool exits 0 and prints exactly the
expected file; --update rewrites the expected files instead.
"""
import argparse
import difflib
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load_cases():
    cases = []
    with open(os.path.join(HERE, "cases.txt")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                expected, *command = shlex.split(line)
                cases.append((expected, command))
    return cases


def stages(command, bin_dir):
    """The case's pipeline as a list of argv lists."""
    pipeline, argv = [], None
    for word in command + ["|"]:
        if word == "|":
            pipeline.append(argv)
            argv = None
        elif argv is None:
            argv = [os.path.join(bin_dir, word)]
        elif word.startswith("@"):
            with open(os.path.join(ROOT, word[1:])) as f:
                argv.extend(shlex.split(f.read()))
        else:
            argv.append(word)
    return pipeline


def run_pipeline(pipeline):
    """Runs the stages piped together; returns (failed stage's message or None, stdout)."""
    data = None
    for argv in pipeline:
        proc = subprocess.run(argv, cwd=ROOT, input=data, capture_output=True)
        if proc.returncode != 0:
            return f"{os.path.basename(argv[0])} exit {proc.returncode}: {proc.stderr.decode().strip()}", ""
        data = proc.stdout
    return None, data.decode()


def run_case(expected, command, bin_dir, update):
    error, stdout = run_pipeline(stages(command, bin_dir))
    if error:
        print(f"FAIL {expected}: {error}")
        return False
    path = os.path.join(HERE, expected)
    if update:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(stdout)
        print(f"wrote {expected}")
        return True
    with open(path) as f:
        want = f.read()
    if want == stdout:
        print(f"PASS {expected}")
        return True
    diff = difflib.unified_diff(want.splitlines(True), stdout.splitlines(True), expected, "actual")
    print(f"FAIL {expected}: output differs\n" + "".join(list(diff)[:60]))
    return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--case")
    parser.add_argument("--update", action="store_true")
    opts = parser.parse_args()
    bin_dir = os.path.abspath(opts.bin_dir)
    cases = [c for c in load_cases() if opts.case in (None, c[0])]
    if not cases:
        print(f"no such case: {opts.case}")
        return 1
    failed = sum(not run_case(e, c, bin_dir, opts.update) for e, c in cases)
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
