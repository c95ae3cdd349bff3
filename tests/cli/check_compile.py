"""spmd-compile against the shell pipeline: from the same flags, its artifact
is byte for byte the one `spmd-expand | spmd-split | spmd-unroll | spmd-lower`
writes, its --stage-dir files are the stages' own outputs and --emit-after
writes the stage's output; the flags the stages record in the artifact
(`spmd-inspect --flags`) hold every flag given, and given back to spmd-compile
make the same artifact; bad flags and failing stages exit 1 in one line and
leave no output.

  check_compile.py BIN_DIR        (run from the repository root)
"""
import filecmp
import os
import re
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
TMP = tempfile.mkdtemp()
passed = failed = 0


def tool(name):
    return os.path.join(BIN, name)


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


# (model, [expand flags], [split flags], [unroll flags], [lower flags])
CASES = [
    ("samples/mlp.pt2", ["--optimizer", "sgd", "--lr", "0.1"], [], [], []),
    ("samples/mlp.pt", ["--input", "x:f32[100,100]", "--optimizer", "adam", "--lr", "0.01"], [], ["--iters", "5"], []),
    ("samples/lm.pt2", ["--optimizer", "adamw", "--lr", "0.01", "--lr-schedule", "cosine", "--decay-steps", "10",
                        "--clip-grad-norm", "1", "--micro-batches", "2"], ["--bucket-cap-mb", "0.01"], [], []),
    ("samples/cnn.pt2", ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9"], [], ["--iters", "3"],
     ["--device", "cuda", "--cudagraphs"]),
    ("samples/lm.pt2", ["--optimizer", "adam", "--autocast", "cuda:bf16", "--reduce-dtype", "bf16"],
     ["--world-size", "2", "--shard", "parameters"], [], ["--device", "cuda"]),
    ("samples/cnn.pt2", ["--optimizer", "sgd", "--lr", "0.05", "--grad-reduce", "sum"], ["--first-bucket-cap-mb", "0.001"],
     ["--no-move"], ["--no-fuse"]),
]


def shell_pipeline(case, work):
    model, expand, split, unroll, lower = case
    files = {}
    stdin = None
    for stage, args in (("expand", [model] + expand), ("split", split), ("unroll", unroll)):
        proc = subprocess.run([tool("spmd-" + stage)] + args, input=stdin, capture_output=True, check=True)
        stdin = proc.stdout
        files[stage] = os.path.join(work, stage + ".json")
        with open(files[stage], "wb") as f:
            f.write(stdin)
    artifact = os.path.join(work, "shell.spmd")
    subprocess.run([tool("spmd-lower"), "-o", artifact] + lower, input=stdin, capture_output=True, check=True)
    return artifact, files


def same_as_shell():
    for i, case in enumerate(CASES):
        work = os.path.join(TMP, f"case{i}")
        os.makedirs(work)
        artifact, files = shell_pipeline(case, work)
        model, expand, split, unroll, lower = case
        flags = expand + split + unroll + lower
        name = f"{model} {' '.join(flags)}"
        one = os.path.join(work, "one.spmd")
        stages = os.path.join(work, "stages")
        proc = run([tool("spmd-compile"), model, *flags, "--stage-dir", stages, "-o", one])
        if proc.returncode != 0:
            report(name, False, proc.stderr.strip())
            continue
        report(f"{name}: the artifact is the shell pipeline's", filecmp.cmp(one, artifact, shallow=False))
        differ = [s for s in files if not filecmp.cmp(files[s], os.path.join(stages, s + ".json"), shallow=False)]
        report(f"{name}: --stage-dir holds each stage's output", not differ, f"differ: {differ}")
        recorded_flags_remake(name, model, flags, one, work)
    # --emit-after: the stage's output, no artifact; --verify-each changes nothing.
    model, expand, split, unroll, lower = CASES[2]
    work = os.path.join(TMP, "case2")
    for stage in ("expand", "split", "unroll"):
        out = os.path.join(work, f"emitted-{stage}.json")
        proc = run([tool("spmd-compile"), model, *expand, *split, *unroll, *lower, "--verify-each", "--emit-after", stage,
                    "-o", out])
        ok = proc.returncode == 0 and filecmp.cmp(out, os.path.join(work, stage + ".json"), shallow=False)
        report(f"--emit-after {stage} writes spmd-{stage}'s output", ok, proc.stderr.strip())


def given_flags(words):
    """{flag: [values]} of a command line's words (a flag without a value: [])."""
    out = {}
    for w in words:
        if w.startswith("--"):
            out.setdefault(w, [])
            last = w
        else:
            out[last].append(w)
    return out


def same_value(a, b):
    try:
        return float(a) == float(b)
    except ValueError:
        return [float(x) for x in a.split(",")] == [float(x) for x in b.split(",")] if "," in a else a == b


def recorded_flags_remake(name, model, flags, artifact, work):
    """The artifact's recorded flags hold each flag given with its value, and
    spmd-compile given them back (with the model's --input) writes the same bytes."""
    proc = run([tool("spmd-inspect"), artifact, "--flags"])
    recorded = proc.stdout.split()
    mine, given = given_flags(recorded), given_flags(flags)
    inputs = [w for i, w in enumerate(flags) if w == "--input" or (i and flags[i - 1] == "--input")]
    missing = [f for f, v in given.items() if f != "--input" and (f not in mine or len(mine[f]) != len(v) or
                                                                  not all(map(same_value, mine[f], v)))]
    report(f"{name}: the artifact records the flags given", proc.returncode == 0 and not missing,
           f"missing or other: {missing}; recorded: {proc.stdout.strip()} {proc.stderr.strip()}")
    again = os.path.join(work, "again.spmd")
    proc = run([tool("spmd-compile"), model, *inputs, *recorded, "-o", again])
    report(f"{name}: the recorded flags make the same artifact", proc.returncode == 0 and
           filecmp.cmp(again, artifact, shallow=False), proc.stderr.strip())


def refusals():
    out = os.path.join(TMP, "refused.spmd")
    stages = os.path.join(TMP, "refused-stages")
    mlp = ["samples/mlp.pt2"]
    cases = [
        ("no --optimizer", mlp + ["-o", out], 1, r"spmd-compile: error: --optimizer: required: sgd, adam or adamw"),
        ("a flag of another optimizer", mlp + ["--optimizer", "adam", "--momentum", "0.9", "-o", out], 1,
         r"spmd-compile: error: --momentum: applies to --optimizer sgd only"),
        ("--emit-after lower", mlp + ["--optimizer", "adam", "--emit-after", "lower", "-o", out], 2,
         r"spmd-compile: error: --emit-after: .*expected expand, split or unroll"),
        ("--shard without --world-size fails in split, leaving nothing",
         mlp + ["--optimizer", "adam", "--shard", "optimizer", "--stage-dir", stages, "-o", out], 1,
         r"spmd-compile: error: .*mlp\.pt2: .*world"),
        ("a missing model", ["samples/none.pt2", "--optimizer", "adam", "-o", out], 1,
         r"spmd-compile: error: samples/none\.pt2: "),
    ]
    for name, args, code, pattern in cases:
        proc = run([tool("spmd-compile")] + args)
        lines = proc.stderr.strip().splitlines()
        ok = (proc.returncode == code and len(lines) >= 1 and re.match(pattern, lines[0]) is not None and
              not os.path.exists(out) and not os.path.exists(stages))
        report(f"refused: {name}", ok, f"exit {proc.returncode}, {proc.stderr.strip()!r}, output left: "
                                       f"{os.path.exists(out) or os.path.exists(stages)}")


def long_names():
    """A legal 255-byte file name is written (its temporary name is cut to fit NAME_MAX); a longer one is
    refused before the first step, not after training."""
    name = os.path.join(TMP, "n" * 250 + ".spmd")
    proc = run([tool("spmd-compile"), "samples/mlp.pt2", "--optimizer", "sgd", "--lr", "0.001", "-o", name])
    report("spmd-compile writes a 255-byte file name", proc.returncode == 0 and os.path.exists(name), proc.stderr[-300:])
    params = os.path.join(TMP, "p" * 252 + ".pt")
    proc = run([tool("spmd-run"), name, "--steps", "1", "--save-params", params])
    report("spmd-run --save-params writes a 255-byte file name", proc.returncode == 0 and os.path.exists(params),
           proc.stderr[-300:])
    too_long = os.path.join(TMP, "q" * 256)
    proc = run([tool("spmd-run"), name, "--steps", "1", "--save-params", too_long])
    report("spmd-run refuses a 256-byte --save-params name before step 1",
           proc.returncode == 1 and "step 1" not in proc.stdout and
           "longer than this file system's 255" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr[-300:])


same_as_shell()
refusals()
long_names()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
