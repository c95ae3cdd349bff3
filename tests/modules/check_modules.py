"""Checks spmd-inspect against the modules that gen_modules.py wrote.

Usage: python3 tests/modules/check_modules.py SPMD_INSPECT OUTDIR

For each module of OUTDIR/manifest.json: `--verify` exits 0, and the `--json`
dump's inputs are the forward arguments (kind "data", in order), then the
parameters and the buffers exactly as named_parameters() / named_buffers()
list them, with requires_grad false on exactly the frozen parameters.
For each case of OUTDIR/errors.json: exit status 1, nothing on stdout, and one
stderr line "spmd-inspect: error: ..." holding the expected message and, when
given, the user's source line.

Prints one line per check, then "N passed, M failed"; exits 1 if any failed.
Standard library only: it runs under any python3.
"""
import json
import os
import re
import subprocess
import sys

ERROR_PREFIX = "spmd-inspect: error: "
TIMEOUT_S = 300


def run(binary, outdir, entry, *flags):
    """Runs the binary on entry's file and --input specs; returns (status, stdout, stderr)."""
    command = [binary, os.path.join(outdir, entry["file"])]
    for spec in entry["inputs"]:
        command += ["--input", spec]
    command += list(flags)
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %d s" % TIMEOUT_S
    except OSError as e:  # a missing or unexecutable binary fails the check, not the run
        return None, "", "cannot run %s: %s" % (binary, e)
    return done.returncode, done.stdout, done.stderr


def output_excerpt(stdout, stderr, limit=2000):
    text = (stderr.strip() + "\n" + stdout.strip()).strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def check_verify(binary, outdir, entry):
    status, out, err = run(binary, outdir, entry, "--verify")
    if status != 0:
        return ["--verify exited %s: %s" % (status, output_excerpt(out, err))]
    return []


def check_json(binary, outdir, entry):
    status, out, err = run(binary, outdir, entry, "--json")
    if status != 0:
        return ["--json exited %s: %s" % (status, output_excerpt(out, err))]
    try:
        dump = json.loads(out)
    except ValueError as e:
        return ["--json printed invalid JSON: %s" % e]
    inputs = dump.get("inputs", [])
    problems = []
    kinds = [i.get("kind") for i in inputs]
    # All data inputs first, then parameters, then buffers.
    expected_kinds = (["data"] * len(entry["inputs"]) + ["parameter"] * len(entry["parameters"]) +
                      ["buffer"] * len(entry["buffers"]))
    if kinds != expected_kinds:
        problems.append("input kinds %s, expected %s" % (kinds, expected_kinds))

    def names(kind):
        return [i.get("name") for i in inputs if i.get("kind") == kind]

    data = [spec.split(":", 1)[0] for spec in entry["inputs"]]
    for kind, expected in (("data", data), ("parameter", entry["parameters"]),
                           ("buffer", entry["buffers"])):
        if names(kind) != expected:
            problems.append("%s inputs %s, expected %s" % (kind, names(kind), expected))

    frozen = set(entry.get("frozen", []))
    for i in inputs:
        trainable = i.get("name") not in frozen
        if i.get("kind") == "parameter" and i.get("requires_grad") != trainable:
            problems.append("parameter %s has requires_grad %s, expected %s" %
                            (i.get("name"), i.get("requires_grad"), trainable))

    # Traced modules: every node names the user's own line (gen_modules.py),
    # not torch.nn's, read from the Python stack the tracer recorded.
    if entry.get("mode") == "trace":
        for k, node in enumerate(dump.get("nodes", [])):
            source = node.get("meta", {}).get("source", "")
            if not source.startswith("gen_modules.py:"):
                problems.append("node %d (%s) names %r, not a gen_modules.py line" % (k, node.get("op"), source))
                break

    # Updates may only write buffers.
    buffers = set(entry["buffers"])
    for update in dump.get("updates", []):
        if update.get("input") not in buffers:
            problems.append("update of %s, which is not a buffer" % update.get("input"))
    return problems


def check_error(binary, outdir, case):
    status, out, err = run(binary, outdir, case)
    problems = []
    if status != 1:
        problems.append("exit status %s, expected 1" % status)
    if out:
        problems.append("stdout not empty: %r" % out[:500])
    lines = err.splitlines()
    if len(lines) != 1 or not lines[0].startswith(ERROR_PREFIX):
        problems.append("stderr is not one %r line: %r" % (ERROR_PREFIX, err[:2000]))
        return problems
    line = lines[0]
    if case["message"] not in line:
        problems.append("no %r in: %s" % (case["message"], line))
    # "gen_modules.py:5" must not match "gen_modules.py:57".
    if case["line"] and not re.search(re.escape(case["line"]) + r"(?!\d)", line):
        problems.append("does not name %s: %s" % (case["line"], line))
    return problems


def load_list(path):
    with open(path) as f:
        return json.load(f)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: %s SPMD_INSPECT OUTDIR" % sys.argv[0])
    binary, outdir = sys.argv[1], sys.argv[2]

    checks = []  # (label, function, entry)
    for entry in load_list(os.path.join(outdir, "manifest.json")):
        checks.append(("%s: --verify" % entry["name"], check_verify, entry))
        checks.append(("%s: --json inputs" % entry["name"], check_json, entry))
    for case in load_list(os.path.join(outdir, "errors.json")):
        checks.append(("%s: rejected" % case["name"], check_error, case))

    passed = failed = 0
    for label, check, entry in checks:
        problems = check(binary, outdir, entry)
        if problems:
            failed += 1
            print("FAIL %s: %s" % (label, "; ".join(problems)))
        else:
            passed += 1
            print("PASS %s" % label)
        sys.stdout.flush()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
