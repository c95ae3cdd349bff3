"""Bad input to spmd-inspect and spmd-expand: each case asserts the exit code
and the one-line message on stderr, and that nothing reaches stdout or the -o
file.

  check_errors.py BIN_DIR      (run from the repository root)
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

BIN_DIR = sys.argv[1]
BIN = os.path.join(BIN_DIR, "spmd-inspect")
EXPAND = os.path.join(BIN_DIR, "spmd-expand")
UNROLL = os.path.join(BIN_DIR, "spmd-unroll")
SPLIT = os.path.join(BIN_DIR, "spmd-split")
LOWER = os.path.join(BIN_DIR, "spmd-lower")
RUN = os.path.join(BIN_DIR, "spmd-run")
MLP = ["samples/mlp.pt", "--input", "x:f32[100,100]"]
passed = failed = 0


def record(name, ok, detail):
    """Counts a check done by hand: PASS, or FAIL with what was seen."""
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def check(name, args, code, pattern, stdin=None, tool=BIN):
    """Runs TOOL ARGS; stderr must be one line matching `pattern`."""
    global passed, failed
    try:
        proc = subprocess.run([tool] + args, input=stdin, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        failed += 1
        print(f"FAIL {name}: no exit within 120 s")
        return
    err = proc.stderr.decode(errors="replace")
    problems = []
    if proc.returncode != code:
        problems.append(f"exit {proc.returncode}, want {code}")
    if code == 1 and (err.count("\n") != 1 or not re.fullmatch(pattern, err.strip())):
        problems.append(f"stderr {err!r} does not match {pattern!r}")
    if code == 2 and not re.search(pattern, err):
        problems.append(f"stderr {err!r} lacks {pattern!r}")
    if proc.stdout:
        problems.append(f"stdout not empty: {proc.stdout[:80]!r}")
    if problems:
        failed += 1
        print(f"FAIL {name}: " + "; ".join(problems))
    else:
        passed += 1
        print(f"PASS {name}")


def graph_json(mutate):
    with open("tests/golden/inspect/mlp.json") as f:
        doc = json.load(f)
    mutate(doc)
    return json.dumps(doc)


def expand_errors(write, graph_json):
    E = r"spmd-expand: error: "

    def expand(name, args, code, pattern, stdin=None):
        check("spmd-expand " + name, args, code, pattern, stdin, tool=EXPAND)

    expand("missing --optimizer", MLP, 1, E + r"--optimizer: required: sgd, adam or adamw")
    expand("unknown optimizer", MLP + ["--optimizer", "rmsprop"], 1,
           E + r"--optimizer: unknown optimizer 'rmsprop' \(sgd, adam, adamw\)")
    expand("negative lr", MLP + ["--optimizer", "adam", "--lr", "-1"], 1, E + r"--lr: Invalid learning rate: -1\.0")
    expand("beta out of range", MLP + ["--optimizer", "adam", "--betas", "1.5,0.9"], 1,
           E + r"--betas: Invalid beta parameter at index 0: 1\.5")
    expand("bad betas syntax", MLP + ["--optimizer", "adam", "--betas", "0.9"], 1,
           E + r"--betas '0\.9': expected two numbers B1,B2")
    expand("negative eps", MLP + ["--optimizer", "adamw", "--eps", "-1e-8"], 1, E + r"--eps: Invalid epsilon value: -1e-08")
    expand("negative weight decay", MLP + ["--optimizer", "sgd", "--lr", "0.1", "--weight-decay", "-0.1"], 1,
           E + r"--weight-decay: Invalid weight_decay value: -0\.1")
    expand("nesterov without momentum", MLP + ["--optimizer", "sgd", "--lr", "0.1", "--nesterov"], 1,
           E + r"--nesterov: Nesterov momentum requires a momentum and zero dampening")
    expand("sgd without lr", MLP + ["--optimizer", "sgd"], 1, E + r"--lr: required for sgd.*")
    expand("momentum with adam", MLP + ["--optimizer", "adam", "--momentum", "0.9"], 1,
           E + r"--momentum: applies to --optimizer sgd only")
    expand("amsgrad with sgd", MLP + ["--optimizer", "sgd", "--lr", "1", "--amsgrad"], 1,
           E + r"--amsgrad: applies to --optimizer adam and adamw only")
    expand("autocast fp16", MLP + ["--optimizer", "adam", "--autocast", "cuda:fp16"], 1,
           E + r"--autocast 'cuda:fp16': fp16 needs dynamic loss scaling .*, which spmd does not do; use bf16")
    expand("autocast bad device", MLP + ["--optimizer", "adam", "--autocast", "tpu:bf16"], 1,
           E + r"--autocast 'tpu:bf16': expected DEVICE:DTYPE with DEVICE cuda or cpu \(cuda:bf16\)")
    expand("autocast not a lower precision", MLP + ["--optimizer", "adam", "--autocast", "cpu:f64"], 1,
           E + r"--autocast 'cpu:f64': autocast's lower precision type must be bf16")
    expand("bad reduce dtype", MLP + ["--optimizer", "adam", "--reduce-dtype", "i64"], 1,
           E + r"--reduce-dtype 'i64': expected f32, bf16 or f16")
    expand("negative warmup", MLP + ["--optimizer", "adam", "--lr-schedule", "cosine", "--warmup-steps", "-2",
                                     "--decay-steps", "10"], 1, E + r"--warmup-steps: must not be negative")
    expand("decay before warmup", MLP + ["--optimizer", "adam", "--lr-schedule", "linear", "--warmup-steps", "10",
                                         "--decay-steps", "4"], 1,
           E + r"--decay-steps: linear decay must end after the warmup: need 4 > --warmup-steps 10")
    expand("cosine without decay steps", MLP + ["--optimizer", "adam", "--lr-schedule", "cosine"], 1,
           E + r"--decay-steps: required for --lr-schedule cosine")
    expand("step schedule without step size", MLP + ["--optimizer", "adam", "--lr-schedule", "step"], 1,
           E + r"--step-size: required for --lr-schedule step")
    expand("gamma without step schedule", MLP + ["--optimizer", "adam", "--gamma", "0.5"], 1,
           E + r"--gamma: applies to --lr-schedule step only")
    expand("negative clip norm", MLP + ["--optimizer", "adam", "--clip-grad-norm", "-1"], 1,
           E + r"--clip-grad-norm: must be a finite number > 0")
    expand("clip norm type alone", MLP + ["--optimizer", "adam", "--clip-grad-norm-type", "inf"], 1,
           E + r"--clip-grad-norm-type: applies with --clip-grad-norm only")
    expand("zero micro-batches", MLP + ["--optimizer", "adam", "--micro-batches", "0"], 1,
           E + r"--micro-batches: must be at least 1")
    expand("usage: bad schedule", MLP + ["--optimizer", "adam", "--lr-schedule", "exp"], 2, r"exp")
    expand("usage: bad grad-reduce", MLP + ["--optimizer", "adam", "--grad-reduce", "max"], 2, r"max")

    def non_scalar(d):
        d["outputs"] = [d["nodes"][1]["outputs"][0]["name"]]
    expand("non-scalar loss", [write("nonscalar.json", graph_json(non_scalar)), "--optimizer", "adam"], 1,
           E + r".*/nonscalar\.json: /outputs/0: the loss must be a floating-point scalar, got %relu: f32\[100,100\]")

    def no_outputs(d):
        d["outputs"] = []
    expand("missing loss", [write("noloss.json", graph_json(no_outputs)), "--optimizer", "adam"], 1,
           E + r".*/noloss\.json: /outputs: the forward returns nothing; .*")

    # special_bessel_j0 has no derivative in LibTorch; the one nearer the loss
    # stops the flow to every parameter before it.
    def no_derivative(d):
        d["nodes"][1]["op"] = "aten::special_bessel_j0"
        d["nodes"][5]["op"] = "aten::special_bessel_j0"
    expand("ops without derivatives", [write("noderivative.json", graph_json(no_derivative)), "--optimizer", "adam"], 1,
           E + r".*/noderivative\.json: cannot differentiate the path from the parameters to the loss: "
           r"aten::special_bessel_j0 at models\.py:24 \(LibTorch's autograd gives %linear_2 no gradient\); "
           r"parameters that reach the loss without a gradient: mod\.0\.weight, mod\.0\.bias, mod\.2\.weight, "
           r"mod\.2\.bias, mod\.4\.weight, mod\.4\.bias$")
    step = subprocess.run([EXPAND] + MLP + ["--optimizer", "adam"], capture_output=True).stdout
    expand("already a train step", ["-", "--optimizer", "adam"], 1,
           E + r"<stdin>: /gradients: the graph already has gradients: it is a train step", stdin=step)
    expand("missing --input", ["samples/mlp.pt", "--optimizer", "adam"], 1,
           E + r"samples/mlp\.pt: forward\(x\): missing --input spec for 'x'")


def unroll_errors(write, graph_json):
    E = r"spmd-unroll: error: "

    def unroll(name, args, code, pattern, stdin=None):
        check("spmd-unroll " + name, args, code, pattern, stdin, tool=UNROLL)

    with open("tests/golden/unroll/mlp.adam.json") as f:
        unrolled = f.read()
    unroll("unrolled twice", [write("unrolled.json", unrolled)], 1, E + r".*/unrolled\.json: /iters: the graph is unrolled already")
    doc = json.loads(unrolled)
    doc["iters"] = 0
    unroll("iters not positive", [write("iters0.json", json.dumps(doc))], 1,
           E + r".*/iters0\.json: /iters: expected a positive integer")
    doc = json.loads(unrolled)
    next(n for n in doc["nodes"] if "iteration" in n.get("meta", {}))["meta"]["iteration"] = "later"
    unroll("unknown iteration tag", [write("tag.json", json.dumps(doc))], 1,
           E + r'.*/tag\.json: /nodes/\d+/meta/iteration: expected "previous" or "last", got "later"')
    doc = json.loads(unrolled)
    del doc["iters"]
    unroll("tags without iters", [write("noiters.json", json.dumps(doc))], 1,
           E + r".*/noiters\.json: /nodes/\d+/meta/iteration: iteration tag in a graph that is not unrolled")
    unroll("usage: --iters 0", ["--iters", "0"], 2, r"iters")
    # spmd-split after spmd-unroll is refused; on a split graph it changes nothing.
    check("spmd-split on an unrolled graph", [write("unrolled.json", unrolled)], 1,
          r"spmd-split: error: .*/unrolled\.json: /iters: the graph is unrolled already: run spmd-split before spmd-unroll",
          tool=SPLIT)
    global passed, failed
    once = subprocess.run([EXPAND] + MLP + ["--optimizer", "adam"], capture_output=True).stdout
    once = subprocess.run([SPLIT], input=once, capture_output=True).stdout
    twice = subprocess.run([SPLIT], input=once, capture_output=True)
    note = twice.stderr.decode(errors="replace")
    if twice.returncode == 0 and twice.stdout == once and "bucketed already" in note and note.count("\n") == 1:
        passed += 1
        print("PASS spmd-split twice leaves the buckets")
    else:
        failed += 1
        print(f"FAIL spmd-split twice leaves the buckets: exit {twice.returncode}, same output {twice.stdout == once}, "
              f"stderr {note!r}")


def help_and_terminal():
    """Every tool's --help ends with examples and the exit codes; a tool whose IN
    defaults to stdin refuses a terminal rather than wait on it."""
    global passed, failed
    tools = ["spmd-inspect", "spmd-expand", "spmd-split", "spmd-unroll", "spmd-lower", "spmd-compile", "spmd-train",
             "spmd-opt", "spmd-run"]
    for name in tools:
        proc = subprocess.run([os.path.join(BIN_DIR, name), "--help"], capture_output=True, text=True)
        text = proc.stdout
        ok = (proc.returncode == 0 and "Examples:\n  " + name in text and "Exit codes:" in text and
              "0  success" in text and "1  failure" in text and "2  usage error" in text)
        passed, failed = passed + ok, failed + (not ok)
        print(("PASS " if ok else "FAIL ") + f"{name} --help has examples and exit codes" +
              ("" if ok else f": {text[-400:]!r}"))
    import pty
    for name, args in (("spmd-inspect", []), ("spmd-split", []), ("spmd-unroll", ["--iters", "2"])):
        master, slave = pty.openpty()
        try:
            proc = subprocess.run([os.path.join(BIN_DIR, name)] + args, stdin=slave, capture_output=True, text=True,
                                  timeout=20)
            code, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            code, err = None, "waited on the terminal"
        finally:
            os.close(master)
            os.close(slave)
        ok = code == 2 and err.count("\n") == 1 and err.startswith(
            f"{name}: error: no input: IN is stdin, a terminal; name a file, pipe one in, or give '-' to type it")
        passed, failed = passed + ok, failed + (not ok)
        print(("PASS " if ok else "FAIL ") + f"{name} on a terminal with no input" +
              ("" if ok else f": exit {code}, {err!r}"))


def reader_errors(write, graph_json, tmp):
    """Issue #19: inputs that crashed the readers or gave errors naming no file."""
    global passed, failed
    tools = [(BIN, []), (EXPAND, ["--optimizer", "adam"]), (SPLIT, []), (UNROLL, []),
             (LOWER, ["-o", os.path.join(tmp, "deep.spmd")]),
             (os.path.join(BIN_DIR, "spmd-compile"), ["--optimizer", "adam", "-o", os.path.join(tmp, "deep.spmd")]),
             (RUN, [])]

    # JSON nested 60k deep (120 KB): a SIGSEGV in every tool before.
    deep = write("deep.json", '{"format": ' + "[" * 60000 + "]" * 60000 + "}")
    for tool, extra in tools:
        name = os.path.basename(tool)
        check(name + " deep nesting", [deep] + extra, 1,
              name + r": error: .*/deep\.json: invalid JSON: nesting deeper than 64 levels at line 1, column 75",
              tool=tool)
    if os.path.exists(os.path.join(tmp, "deep.spmd")):
        failed += 1
        print("FAIL deep nesting: spmd-lower or spmd-compile left an output file")

    # Bad values are echoed cut short, on one line.
    E = r"spmd-inspect: error: "
    long_name = "x" * 100000

    def long_value(d):
        d["nodes"][1]["args"][0] = {"value": long_name}
    check("long bad value echoed short", [write("long.json", graph_json(long_value))], 1,
          E + r".*/long\.json: /nodes/1/args/0/value: unknown value '" + "x" * 60 + r"\.\.\.'")

    def newline_value(d):
        d["nodes"][1]["args"][0] = {"value": "x\ny"}
    check("newline in a bad value", [write("newline.json", graph_json(newline_value))], 1,
          E + r".*/newline\.json: /nodes/1/args/0/value: unknown value 'x\\ny'")

    def huge_string(d):
        d["nodes"][1]["op"] = "y" * (3 << 20)
    check("string over the bound", [write("huge.json", graph_json(huge_string))], 1,
          E + r".*/huge\.json: invalid JSON: a string longer than 1048576 characters at line \d+, column \d+")

    def bad_version(d):
        d["version"] = [[[1]]]
    check("array echoed by its type", [write("version.json", graph_json(bad_version))], 1,
          E + r".*/version\.json: /version: unsupported version an array \(this build reads 1\)")

    # Numbers beyond double's range: was nlohmann's raw exception text.
    text = graph_json(lambda d: d.update(iters=12345)).replace("12345", "1e999")
    check("number out of range", [write("inf.json", text)], 1,
          E + r".*/inf\.json: invalid JSON: number 1e999 is out of range at line \d+, column \d+")

    # Errors that named no file.
    check("directory as input", [tmp], 1, E + re.escape(tmp) + r": is a directory, not a file")
    check("--input shape overflow", ["samples/mlp.pt", "--input", "x:f32[99999999999,99999999999]"], 1,
          E + r"--input 'x:f32\[99999999999,99999999999\]': shape with more than 2\^48 elements in one tensor")

    def overflow_shape(d):
        d["inputs"][0]["shape"] = [99999999999, 99999999999]
    check("dump shape overflow", [write("overflow.json", graph_json(overflow_shape))], 1,
          E + r".*/overflow\.json: /inputs/0/shape: shape with more than 2\^48 elements in one tensor")

    def unknown_op(d):
        d["nodes"][1]["op"] = "aten::frobnicate"
    check("spmd-run lowering error names the file", [write("runop.json", graph_json(unknown_op))], 1,
          r"spmd-run: error: .*/runop\.json: /nodes/1/op: unknown operator 'aten::frobnicate' in this LibTorch",
          tool=RUN)

    artifact_header_errors(write, tmp)
    shape_inference_memory(write, tmp)


def damaged_zip_errors(write, tmp):
    """Issue 44: zips cut short crashed every tool inside LibTorch's reader
    (SIGSEGV); damaged members were read as they were."""
    global passed, failed
    step = subprocess.run([EXPAND] + MLP + ["--optimizer", "adam"], capture_output=True).stdout
    artifact = os.path.join(tmp, "whole.spmd")
    subprocess.run([LOWER, "-", "-o", artifact], input=step, capture_output=True, check=True)
    damaged = r"(not a zip file, or a damaged one|damaged zip file: member '.*' does not match its CRC-32)"
    for path, extra in ((artifact, []), ("samples/lm.pt", ["--input", "tokens:i64[4,16]", "--input", "targets:i64[4,16]"])):
        with open(path, "rb") as f:
            whole = f.read()
        bad = []
        for k in range(1, 40):  # cut at 39 lengths through the file
            cut = write("cut.bin", whole[: len(whole) * k // 40])
            proc = subprocess.run([BIN, cut, "--stats"] + extra, capture_output=True)
            err = proc.stderr.decode(errors="replace").strip()
            if proc.returncode != 1 or "\n" in err or not re.fullmatch(r"spmd-inspect: error: .*/cut\.bin: " + damaged, err):
                bad.append(f"{len(whole) * k // 40} bytes: exit {proc.returncode}, {err[:120]!r}")
        name = f"{os.path.basename(path)} cut short at 39 lengths"
        if bad:
            failed += 1
            print(f"FAIL {name}: " + "; ".join(bad[:3]))
        else:
            passed += 1
            print(f"PASS {name}")
    # One byte changed in a torch.save file's tensor data (a data file here,
    # as a checkpoint's would be): refused by the member's CRC-32.
    import torch
    data = os.path.join(tmp, "data.pt")
    torch.save({"x": torch.zeros(2, 100, 100)}, data)
    raw = bytearray(open(data, "rb").read())
    at = raw.find(b"\0" * 4096) + 2048  # inside the zeros
    raw[at] ^= 0x40
    check("damaged tensor data in --data", [artifact, "--data", write("flipped.pt", bytes(raw)), "--steps", "1"], 1,
          r"spmd-run: error: .*/flipped\.pt: damaged zip file: member 'data/data/0' does not match its CRC-32", tool=RUN)


def write_step(tmp, step):
    path = os.path.join(tmp, "cut_member.json")
    with open(path, "wb") as f:
        f.write(step)
    return path


def cut_member_errors(tmp):
    """Issue 57: a TorchScript file whose tensor member is cut to nothing or
    short (the zip and its CRCs valid) crashed spmd-lower and spmd-run with
    SIGSEGV: LibTorch's loader, which took the file after our reader refused
    it, made tensors over the missing bytes. Refused in one line, no output."""
    import zipfile
    with zipfile.ZipFile("samples/mlp.pt") as zin:
        members = [(info, zin.read(info.filename)) for info in zin.infolist()]
    victim = sorted(i.filename for i, _ in members if "/data/" in i.filename)[0]
    for label, keep in (("cut to nothing", 0), ("cut short", 3000)):
        path = os.path.join(tmp, "cut_member.pt")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
            for info, data in members:
                zout.writestr(info, data[:keep] if info.filename == victim else data)
        want = r".*/cut_member\.pt: storage record 'data/0' has %d bytes, expected 40000" % keep
        out = os.path.join(tmp, "cut_member.spmd")
        check(f"spmd-lower: a tensor member {label}", [path] + MLP[1:] + ["-o", out], 1, r"spmd-lower: error: " + want,
              tool=LOWER)
        step = subprocess.run([EXPAND, path] + MLP[1:] + ["--optimizer", "sgd", "--lr", "0.1"],
                              capture_output=True).stdout
        check(f"spmd-run: a tensor member {label}", [write_step(tmp, step), "--steps", "1"], 1,
              r"spmd-run: error: " + want, tool=RUN)
        record(f"spmd-lower: a tensor member {label}: no output", not os.path.exists(out), "the -o file exists")


def output_target_errors(tmp):
    """Issue 44: -o replaced devices and symbolic links with regular files."""
    global passed, failed
    expand = [EXPAND] + MLP + ["--optimizer", "sgd", "--lr", "0.1", "-o"]
    subprocess.run(expand + ["/dev/null"], capture_output=True, check=True)
    import stat
    ok = stat.S_ISCHR(os.stat("/dev/null").st_mode)
    real, link = os.path.join(tmp, "real.json"), os.path.join(tmp, "link.json")
    os.symlink("real.json", link)
    subprocess.run(expand + [link], capture_output=True, check=True)
    ok = ok and os.path.islink(link) and os.path.getsize(real) > 0
    if ok:
        passed += 1
        print("PASS -o writes /dev/null in place and a symbolic link through")
    else:
        failed += 1
        print("FAIL -o writes /dev/null in place and a symbolic link through")
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    check("-o to a FIFO nobody reads", MLP + ["--optimizer", "sgd", "--lr", "0.1", "-o", fifo], 1,
          r"spmd-expand: error: .*/fifo: cannot write: a FIFO that nobody reads", tool=EXPAND)


def full_stdout_errors(tmp):
    """Issue 57: spmd-run > /dev/full (with and without --json) exited 0."""
    lm = ["samples/lm.pt"] + open("samples/lm.inputs").read().split()
    step = subprocess.run([EXPAND] + lm + ["--optimizer", "sgd", "--lr", "0.1"], capture_output=True, check=True).stdout
    artifact = os.path.join(tmp, "lm-full.spmd")
    subprocess.run([LOWER, "-", "-o", artifact], input=step, capture_output=True, check=True)
    for extra in ([], ["--json"]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([RUN, artifact, "--steps", "2", *extra], stdout=full, stderr=subprocess.PIPE,
                                  timeout=120)
        err = proc.stderr.decode(errors="replace").strip()
        record(f"spmd-run {' '.join(extra)}> /dev/full exits 1", proc.returncode == 1 and re.fullmatch(
            r"spmd-run: error: <stdout>: cannot write: .+", err) is not None,
            f"exit {proc.returncode}, stderr {err!r}")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([BIN, "samples/mlp.pt"], stdout=full, stderr=subprocess.PIPE, timeout=120)
    record("spmd-inspect > /dev/full exits 1", proc.returncode == 1, f"exit {proc.returncode}")


def bound_errors():
    """Issue 57: --micro-batches 100000 grew to 2.9 GB and ran past 60 s;
    --bucket-cap-mb nan was accepted."""
    check("--micro-batches past the node bound", MLP + ["--optimizer", "sgd", "--lr", "0.1", "--micro-batches",
                                                        "100000"], 1,
          r"spmd-expand: error: samples/mlp\.pt: --micro-batches: 100000 copies of the step's \d+ nodes pass the bound of 2097152 "
          r"nodes: take fewer micro-batches of more rows \(--input\)", tool=EXPAND)
    graph = subprocess.run([EXPAND] + MLP + ["--optimizer", "sgd", "--lr", "0.1"], capture_output=True,
                           check=True).stdout
    for flag in ("--bucket-cap-mb", "--first-bucket-cap-mb"):
        for value in ("nan", "inf"):
            check(f"{flag} {value}", ["-", flag, value], 2, r"must be a finite number > 0", stdin=graph,
                  tool=SPLIT)


def stream_and_fifo_errors(tmp):
    """Issue 44: reading /dev/zero grew without bound; FIFOs given to --data,
    --tokens and --metrics hung."""
    check("input from /dev/zero", ["/dev/zero"], 1,
          r"spmd-inspect: error: /dev/zero: more than 2 GiB from a pipe or device: write it to a file, "
          r"which is mapped at any size")
    lm = ["samples/lm.pt"] + open("samples/lm.inputs").read().split()
    step = subprocess.run([EXPAND] + lm + ["--optimizer", "sgd", "--lr", "0.1"], capture_output=True, check=True).stdout
    artifact = os.path.join(tmp, "lm.spmd")
    subprocess.run([LOWER, "-", "-o", artifact], input=step, capture_output=True, check=True)
    fifo = os.path.join(tmp, "input-fifo")
    os.mkfifo(fifo)
    for flag in ("--data", "--tokens"):
        check(f"{flag} a FIFO", [artifact, "--steps", "1", flag, fifo], 1,
              r"spmd-run: error: .*/input-fifo: not a regular file", tool=RUN)
    check("--metrics to a FIFO nobody reads", [artifact, "--steps", "1", "--metrics", fifo], 1,
          r"spmd-run: error: .*--metrics .*/input-fifo: cannot write: a FIFO that nobody reads", tool=RUN)


def huge_batch_errors():
    """Issue 44: a module traced on CPU tensors (its meta trace fails) given a huge
    batch was refused with the meta trace's reason alone; one whose meta trace
    works must not be traced on CPU tensors."""
    import tempfile
    import torch

    class ReadsAValue(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.fc(x).mean() * float(x.abs().max())  # a value: no trace on the meta device

    with tempfile.TemporaryDirectory() as tmp:
        module = os.path.join(tmp, "reads.pt")
        torch.jit.script(ReadsAValue()).save(module)
        check("a module read on CPU tensors, with a batch of 100,000,000",
              [module, "--input", "x:f32[100000000,4]", "--optimizer", "sgd", "--lr", "0.1"], 1,
              r"spmd-expand: error: .*/reads\.pt: forward: the per-rank inputs take 1525 MiB, more than the 512 MiB "
              r"a trace on CPU tensors may take, which this module needs \(on the meta device, .*\): give smaller "
              r"per-rank shapes", tool=EXPAND)
    # cnn.pt's convolutions once sent its trace to CPU tensors (Debian's
    # LibTorch has no meta kernel for them): now traced on the meta device.
    proc = subprocess.run([EXPAND, "samples/cnn.pt", "--input", "x:f32[1000000,3,16,16]", "--input", "y:f32[1000000,4]",
                           "--optimizer", "sgd", "--lr", "0.1", "--time-passes"], capture_output=True, timeout=120)
    record("cnn with a batch of 1,000,000 traced on the meta device",
           proc.returncode == 0 and b"trace forward on the meta device" in proc.stderr
           and b"trace forward on CPU tensors" not in proc.stderr,
           f"exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]!r}")
    # lm.pt calls F.scaled_dot_product_attention(is_causal=True), whose math once
    # sent its trace to CPU tensors (where had no meta kernel): a batch of
    # 1,000,000 computed for minutes there. On the meta device it costs nothing.
    name = "lm with a batch of 1,000,000 traced on the meta device"
    try:
        proc = subprocess.run([EXPAND, "samples/lm.pt", "--input", "tokens:i64[1000000,16]", "--input",
                               "targets:i64[1000000,16]", "--optimizer", "sgd", "--lr", "0.1", "--time-passes"],
                              capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        record(name, False, "no exit within 120 s")
        return
    traced_on_meta = proc.returncode == 0 and b"trace forward on the meta device" in proc.stderr \
        and b"trace forward on CPU tensors" not in proc.stderr and b"spmd::attention" in proc.stdout
    record(name, traced_on_meta, f"exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]!r}")


def utf8_and_bounds_errors(tmp):
    """A file name that is not UTF-8 comes back escaped, whole characters kept: the
    error line is valid UTF-8. --timeout takes (0, 86400] seconds, NaN and inf refused."""
    global passed, failed
    name = os.path.join(os.fsencode(tmp), b"caf\xc3\xa9-\xff\xfe.pt")
    with open(name, "wb") as f:
        f.write(b"hello\n")
    proc = subprocess.run([BIN, name], capture_output=True)
    try:
        err = proc.stderr.decode("utf-8")
    except UnicodeDecodeError:
        err = None
    if proc.returncode == 1 and err is not None and err.count("\n") == 1 and \
            "/caf\u00e9-\\xff\\xfe.pt: neither a torch.export program or TorchScript module" in err:
        passed += 1
        print("PASS a file name that is not UTF-8 is escaped")
    else:
        failed += 1
        print(f"FAIL a file name that is not UTF-8 is escaped: exit {proc.returncode}, stderr {proc.stderr!r}")
    for value in ("nan", "inf", "1e10", "0", "-5", "soon"):
        check(f"spmd-run --timeout {value}", ["samples/mlp.pt", "--timeout", value], 2,
              r"--timeout: (must be more than 0 and at most 86400 seconds \(a day\)|not a number of seconds)",
              tool=RUN)


def rezip(src, dst, edit_header):
    """Copies the artifact `src` to `dst` with header.json edited (and a zip
    rewritten as a user's zip tool would, so that the zip's own CRCs hold)."""
    import zipfile
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/header.json"):
                header = json.loads(data)
                edit_header(header)
                data = json.dumps(header, indent=2).encode() + b"\n"
            zout.writestr(info.filename, data)
    return dst


def artifact_header_errors(write, tmp):
    step = subprocess.run([EXPAND] + MLP + ["--optimizer", "adam"], capture_output=True).stdout
    artifact = os.path.join(tmp, "step.spmd")
    subprocess.run([LOWER, "-", "-o", artifact], input=step, capture_output=True)
    E = r"spmd-inspect: error: "
    same = rezip(artifact, os.path.join(tmp, "same.spmd"), lambda h: None)
    check("artifact rezipped unchanged", [same, "--stats", "-o", os.path.join(tmp, "stats.txt")], 0, "", tool=BIN)
    for field, value in (("device", "gpu"), ("cudagraphs", True)):
        edited = rezip(artifact, os.path.join(tmp, "edited.spmd"), lambda h: h.update({field: value}))
        check("artifact header " + field + " edited", [edited, "--stats"], 1,
              E + r".*/edited\.spmd: header\.json: checksum mismatch: the artifact was altered or is damaged")
    old = rezip(artifact, os.path.join(tmp, "old.spmd"), lambda h: h.update(version=1))
    check("artifact of version 1", [old], 1,
          E + r".*/old\.spmd: header\.json/version: unsupported artifact version 1 \(this build reads 4\): "
          r"lower the graph again with spmd-lower")


def peak_rss_mib(args):
    """Runs ARGS in a child of a fresh python, returning (exit code, stderr, max RSS in MiB)."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
             "stderr=subprocess.PIPE); sys.stderr.write(p.stderr.decode(errors='replace')); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)")
    proc = subprocess.run([sys.executable, "-c", probe] + args, capture_output=True, text=True)
    code, rss = proc.stdout.split()
    return int(code), proc.stderr, int(rss)


def shape_inference_memory(write, tmp):
    """Shape inference must not allocate memory proportional to the tensors
    (ops without C++ meta kernels run on zero-filled CPU stand-ins)."""
    global passed, failed
    # The CNN's forward as a dump with a batch of 65536 (its TorchScript import
    # traces on CPU tensors: see README): batch norm, relu, convolution_backward.
    cnn = json.loads(subprocess.run([BIN, "samples/cnn.pt", "--input", "x:f32[5,3,16,16]", "--input", "y:f32[5,4]",
                                     "--json"], capture_output=True).stdout)
    for v in cnn["inputs"] + [o for n in cnn["nodes"] for o in n["outputs"] if o]:
        if v["shape"][:1] == [5]:
            v["shape"][0] = 65536
    big_cnn = write("cnn65536.json", json.dumps(cnn))
    cases = [("inspect 2e6 rows", [BIN, "samples/mlp.pt", "--input", "x:f32[2000000,100]", "--stats"]),
             ("inspect 1e9 rows", [BIN, "samples/mlp.pt", "--input", "x:f32[1000000000,100]", "--verify"]),
             ("expand 2e6 rows", [EXPAND, "samples/mlp.pt", "--input", "x:f32[2000000,100]", "--optimizer", "adam"]),
             ("verify cnn 65536 images", [BIN, big_cnn, "--verify"]),
             ("expand cnn 65536 images", [EXPAND, big_cnn, "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9"])]
    # An op without a meta kernel and without a batch rule: refused above the
    # bound, naming the file, the node and the op, before allocating.
    costly = {"format": "spmd-graph", "version": 1, "outputs": ["hardtanh_backward"],
              "inputs": [{"name": n, "dtype": "float32", "shape": [200000000], "kind": "data"} for n in ("g", "x")],
              "nodes": [{"op": "aten::hardtanh_backward", "args": [{"value": "g"}, {"value": "x"}, {"float": -1.0},
                                                                   {"float": 1.0}],
                         "outputs": [{"name": "hardtanh_backward", "dtype": "float32", "shape": [200000000]}]}]}
    code, err, rss = peak_rss_mib([BIN, write("costly.json", json.dumps(costly)), "--verify"])
    want = (r"spmd-inspect: error: .*/costly\.json: /nodes/0: aten::hardtanh_backward rejects its arguments: "
            r"shape inference for aten::hardtanh_backward would need 1525 MiB of zero-filled CPU tensors "
            r"\(this LibTorch has no meta kernel for it; the bound is 512 MiB\): give smaller per-rank shapes\n")
    if code == 1 and rss < 600 and re.fullmatch(want, err):
        passed += 1
        print(f"PASS shape inference refused above the bound ({rss} MiB)")
    else:
        failed += 1
        print(f"FAIL shape inference refused above the bound: exit {code}, {rss} MiB, stderr {err[:400]!r}")
    for name, args in cases:
        code, err, rss = peak_rss_mib(args)
        if code == 0 and rss < 600:
            passed += 1
            print(f"PASS shape inference memory: {name} ({rss} MiB)")
        else:
            failed += 1
            print(f"FAIL shape inference memory: {name}: exit {code}, {rss} MiB (want < 600), stderr {err[:300]!r}")


def main():
    tmp = tempfile.mkdtemp()

    def write(name, data):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return path

    E = r"spmd-inspect: error: "
    check("missing file", [os.path.join(tmp, "nope.pt")], 1, E + r".*/nope\.pt: cannot open: No such file or directory")
    check("empty file", [write("empty.pt", b"")], 1, E + r".*/empty\.pt: empty input")
    check("empty stdin", ["-"], 1, E + r"<stdin>: empty input", stdin=b"")
    with open("samples/mlp.pt", "rb") as f:
        module = f.read()
    check("truncated zip", [write("cut.pt", module[: len(module) // 2]), "--input", "x:f32[100,100]"], 1,
          E + r".*/cut\.pt: not a zip file, or a damaged one")
    check("neither format", [write("x.txt", "hello\n")], 1,
          E + r".*/x\.txt: neither a torch.export program or TorchScript module \(zip\) nor a JSON graph dump or listing")
    check("invalid JSON", [write("bad.json", '{"format": ')], 1, E + r".*/bad\.json: invalid JSON: parse error.*")
    check("schema violation", [write("schema.json", graph_json(lambda d: d.update(version="1")))], 1,
          E + r".*/schema\.json: /version: unsupported version \"1\".*")

    def unknown_op(d):
        d["nodes"][1]["op"] = "aten::frobnicate"
    check("unknown op", [write("op.json", graph_json(unknown_op))], 1,
          E + r".*/op\.json: /nodes/1/op: unknown operator 'aten::frobnicate' in this LibTorch")

    def wrong_arity(d):
        d["nodes"][0]["args"].pop()
    check("wrong arity", [write("arity.json", graph_json(wrong_arity))], 1,
          E + r".*/arity\.json: /nodes/0/args: aten::linear at models.py:24 takes 3 arguments, got 2")

    def bad_shape(d):
        d["inputs"][0]["shape"] = [100, 7]
    check("shape mismatch", [write("shape.json", graph_json(bad_shape))], 1,
          E + r".*/shape\.json: /nodes/0: aten::linear at models.py:24 rejects its arguments: .*")

    def unknown_value(d):
        d["nodes"][1]["args"][0] = {"value": "x9"}
    check("unknown value", [write("value.json", graph_json(unknown_value))], 1,
          E + r".*/value\.json: /nodes/1/args/0/value: unknown value 'x9'")
    check("missing --input", ["samples/mlp.pt"], 1, E + r"samples/mlp\.pt: forward\(x\): missing --input spec for 'x'")
    fused = "graph\n  input %x: f32[4,8] data\n  %y: {t}[4,8] = spmd::fused([%x], \"{p}\")\n  return (%y)\n"
    check("bad generated-kernel program", [write("prog.spmd", fused.format(t="f32", p="t0:f32 = frob(in0); return t0")),
                                           "--kernels"], 1,
          E + r".*/prog\.spmd: /nodes/0: spmd::fused rejects its arguments: spmd::fused: bad program: "
          r"at character 9: unknown operation")
    check("generated kernel of another dtype", [write("dt.spmd", fused.format(t="bf16", p="t0:f32 = neg(in0); return t0")),
                                                "--kernels"], 1,
          E + r".*/dt\.spmd: /nodes/0/outputs/0: spmd::fused gives dtype float32, the graph says bfloat16")
    check("--source without --kernels", ["samples/mlp.pt", "--source"], 2, r"spmd-inspect: error: --source requires --kernels")
    check("unknown --input", MLP + ["--input", "y:f32[1]"], 1,
          E + r"samples/mlp\.pt: --input y: forward has no argument 'y'")
    check("bad spec syntax", ["samples/mlp.pt", "--input", "x:f32[100,"], 1,
          E + r"--input 'x:f32\[100,': expected NAME:DTYPE\[d0,d1,...\]")
    check("bad spec dtype", ["samples/mlp.pt", "--input", "x:f33[100,100]"], 1,
          E + r"--input 'x:f33\[100,100\]': unknown dtype 'f33'")
    check("wrong input shape", ["samples/mlp.pt", "--input", "x:f32[100,7]"], 1,
          E + r"samples/mlp\.pt: models\.py:24: running forward on the given input shapes failed: .*mat1 and mat2.*")

    # --verify lists every problem, one line each, and still exits 1.
    def two_problems(d):
        d["nodes"][1]["op"] = "aten::frobnicate"
        d["nodes"][3]["outputs"][0]["shape"] = [1]
    proc = subprocess.run([BIN, write("two.json", graph_json(two_problems)), "--verify"], capture_output=True, text=True)
    lines = proc.stderr.strip().split("\n")
    global passed, failed
    if proc.returncode == 1 and len(lines) == 2 and all(l.startswith("spmd-inspect: error: ") for l in lines):
        passed += 1
        print("PASS --verify lists every problem")
    else:
        failed += 1
        print(f"FAIL --verify lists every problem: exit {proc.returncode}, stderr {proc.stderr!r}")

    # A failed run leaves no output file behind.
    out = os.path.join(tmp, "out.json")
    check("no partial output", [write("op2.json", graph_json(unknown_op)), "--json", "-o", out], 1, E + r".*unknown operator.*")
    if os.path.exists(out):
        failed += 1
        print("FAIL no partial output: the -o file exists")

    check("usage: unknown flag", MLP + ["--frobnicate"], 2, r"frobnicate")
    check("usage: exclusive modes", MLP + ["--json", "--dot"], 2, r"excludes")
    expand_errors(write, graph_json)
    unroll_errors(write, graph_json)
    help_and_terminal()
    reader_errors(write, graph_json, tmp)
    damaged_zip_errors(write, tmp)
    cut_member_errors(tmp)
    output_target_errors(tmp)
    stream_and_fifo_errors(tmp)
    full_stdout_errors(tmp)
    bound_errors()
    huge_batch_errors()
    utf8_and_bounds_errors(tmp)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
