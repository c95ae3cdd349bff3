"""spmd-lower and spmd-run under faults and bad input: every rank ends with an
error naming it within --timeout, never a hang; bad data and artifacts are
refused before step 1; a kernel that fails names its node.

  check_run.py BIN_DIR        (run from the repository root; python3 with torch)
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch

BIN = sys.argv[1]
TMP = tempfile.mkdtemp()
passed = failed = 0


def tool(name):
    return os.path.join(BIN, name)


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_artifact(name, device="cpu", sample="samples/mlp.pt", inputs=("x:f32[8,100]",), expand_flags=()):
    path = os.path.join(TMP, name)
    specs = [arg for spec in inputs for arg in ("--input", spec)]
    expand = subprocess.run([tool("spmd-expand"), sample, *specs, "--optimizer", "sgd", "--lr", "0.01", *expand_flags],
                            capture_output=True, check=True)
    split = subprocess.run([tool("spmd-split")], input=expand.stdout, capture_output=True, check=True)
    subprocess.run([tool("spmd-lower"), "-o", path, "--device", device], input=split.stdout, capture_output=True,
                   check=True)
    return path


def rank_env(rank, world, port):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    return env


def wait_for_step(proc, step, limit=30):
    """Reads proc's stdout until it reports `step`; returns the text read."""
    text, start = b"", time.time()
    os.set_blocking(proc.stdout.fileno(), False)
    while time.time() - start < limit:
        chunk = proc.stdout.read() or b""
        text += chunk
        if f"step {step}/".encode() in text:
            return text.decode()
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    return text.decode()


def one_line_error(stderr, fragment):
    lines = [l for l in stderr.strip().split("\n") if l]
    return len(lines) >= 1 and all(l.startswith("spmd-run: error: ") for l in lines) and fragment in stderr


def main():
    step = build_artifact("mlp.spmd")

    # A peer that never joins: rank 0 of 2 alone gives up after --timeout.
    start = time.time()
    proc = subprocess.run([tool("spmd-run"), step, "--steps", "2", "--timeout", "3"], env=rank_env(0, 2, free_port()),
                          capture_output=True, text=True, timeout=60)
    took = time.time() - start
    report("peer never joins", proc.returncode == 1 and took < 20 and one_line_error(proc.stderr, "rank 0"),
           f"exit {proc.returncode} after {took:.1f}s: {proc.stderr!r}")

    # A busy port.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([tool("spmd-run"), step, "--steps", "1", "--timeout", "5"], env=rank_env(0, 2, port),
                              capture_output=True, text=True, timeout=60)
        report("busy port", proc.returncode == 1 and one_line_error(proc.stderr, "busy"), proc.stderr)

    # A rank killed mid-run under --nproc: the launcher stops the others and names it.
    proc = subprocess.Popen([tool("spmd-run"), step, "--nproc", "2", "--steps", "100000", "--timeout", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_step(proc, 3)
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                text=True).stdout.split()]
    if len(children) == 2:
        os.kill(children[1], signal.SIGKILL)
    try:
        proc.wait(timeout=30)
        err = proc.stderr.read().decode()
        report("rank killed under --nproc", proc.returncode == 1 and "was killed by signal 9" in err, err)
    except subprocess.TimeoutExpired:
        proc.kill()
        report("rank killed under --nproc", False, "the launcher hung")

    # Ranks started by another launcher (as torchrun does): kill rank 1, rank 0 must fail within the timeout.
    port = free_port()
    ranks = [subprocess.Popen([tool("spmd-run"), step, "--steps", "100000", "--timeout", "10"], env=rank_env(r, 2, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    wait_for_step(ranks[0], 3)
    ranks[1].kill()
    start = time.time()
    try:
        ranks[0].wait(timeout=40)
        err = ranks[0].stderr.read().decode()
        report("peer killed mid-run", ranks[0].returncode == 1 and time.time() - start < 30 and
               one_line_error(err, "rank 0: a collective failed"), f"exit {ranks[0].returncode}: {err!r}")
    except subprocess.TimeoutExpired:
        ranks[0].kill()
        report("peer killed mid-run", False, "rank 0 hung")

    # Bad data: each refused before step 1, naming the input.
    def data_case(name, data, fragment, nproc="2"):
        path = os.path.join(TMP, name + ".pt")
        torch.save(data, path)
        proc = subprocess.run([tool("spmd-run"), step, "--nproc", nproc, "--steps", "1", "--data", path],
                              capture_output=True, text=True, timeout=60)
        report(name, proc.returncode == 1 and "step 1" not in proc.stdout and fragment in proc.stderr, proc.stderr)

    data_case("data lacks an input", {"y": torch.zeros(1, 16, 100)}, "'x': the data file has no tensor", "1")
    data_case("data of the wrong shape", {"x": torch.zeros(1, 16, 99)}, "the graph takes f32[8,100]", "1")
    data_case("batch not divisible by N", {"x": torch.zeros(1, 15, 100)}, "does not divide among 2 ranks")
    data_case("data of zero steps", {"x": torch.zeros(0, 16, 100)}, "'x': the data file holds no steps")
    # A NaN loss stops the run at its step, unless --allow-nonfinite.
    data_case("NaN loss", {"x": torch.full((1, 8, 100), float("nan"))}, "step 1: rank 0's loss is nan (--allow-nonfinite", "1")
    nan_data = os.path.join(TMP, "NaN loss.pt")
    proc = subprocess.run([tool("spmd-run"), step, "--steps", "2", "--data", nan_data, "--allow-nonfinite"],
                          capture_output=True, text=True, timeout=60)
    report("NaN loss with --allow-nonfinite", proc.returncode == 0 and "step 2/2  loss nan" in proc.stdout,
           proc.stdout + proc.stderr)
    # With --micro-batches 4 each rank takes 4 x 8 rows.
    micro = build_artifact("micro.spmd", expand_flags=("--micro-batches", "4"))
    def micro_case(name, rows, fragment):
        path = os.path.join(TMP, name + ".pt")
        torch.save({"x": torch.zeros(1, rows, 100)}, path)
        proc = subprocess.run([tool("spmd-run"), micro, "--steps", "1", "--data", path], capture_output=True, text=True,
                              timeout=60)
        report(name, proc.returncode == 1 and "step 1" not in proc.stdout and fragment in proc.stderr, proc.stderr)
    micro_case("rows not divisible into micro-batches", 30, "'x': each rank's 30 rows do not divide into the step's 4 "
               "micro-batches")
    micro_case("micro-batches of the wrong size", 16, "the graph takes f32[32,100] (4 micro-batches of 8 rows)")

    # A kernel that fails at run time (token ids past the embedding's 64 rows):
    # one line naming the node and its op, after the artifact.
    lm = build_artifact("lm.spmd", sample="samples/lm.pt", inputs=("tokens:i64[4,16]", "targets:i64[4,16]"))
    bad = os.path.join(TMP, "bad_tokens.pt")
    torch.save({"tokens": torch.full((1, 4, 16), 1000, dtype=torch.int64),
                "targets": torch.zeros(1, 4, 16, dtype=torch.int64)}, bad)
    proc = subprocess.run([tool("spmd-run"), lm, "--steps", "1", "--data", bad], capture_output=True, text=True,
                          timeout=60)
    match = re.fullmatch(r"spmd-run: error: (.*): /nodes/\d+ \(aten::embedding\): index out of range in self\n",
                         proc.stderr)
    report("kernel error names its node", proc.returncode == 1 and match is not None and match.group(1) == lm and
           "step 1" not in proc.stdout, proc.stderr)

    # An artifact lowered for CUDA, on a machine without CUDA.
    if not torch.cuda.is_available():
        cuda_step = build_artifact("cuda.spmd", "cuda")
        proc = subprocess.run([tool("spmd-run"), cuda_step, "--steps", "1"], capture_output=True, text=True, timeout=60)
        report("CUDA artifact on a CPU machine", proc.returncode == 1 and "no CUDA device" in proc.stderr, proc.stderr)

    # --profile: a table of ops on 2 ranks; a file nowhere writable is refused before step 1.
    prof = os.path.join(TMP, "profile.txt")
    proc = subprocess.run([tool("spmd-run"), step, "--nproc", "2", "--steps", "3", "--warmup", "1", "--profile", prof],
                          capture_output=True, text=True, timeout=60)
    table = open(prof).read() if os.path.exists(prof) else ""
    report("--profile writes a table", proc.returncode == 0 and "2 timed steps, rank 0 of 2 (cpu)" in table and
           "aten::linear" in table and "spmd::bucket_wait" in table and "total" in table, proc.stderr + table)
    for flag in ("--profile", "--save-params"):
        proc = subprocess.run([tool("spmd-run"), step, "--steps", "1", flag, "/nonexistent-dir/out"],
                              capture_output=True, text=True, timeout=60)
        report(flag + " to a missing directory", proc.returncode == 1 and "step 1" not in proc.stdout and
               one_line_error(proc.stderr, "cannot write to /nonexistent-dir"), proc.stderr)

    # --metrics: one JSON object per step, appended (a second run adds its own
    # lines), with the schedule's rate and the clipped step's norm; a path that
    # cannot be opened is refused before step 1.
    sched = build_artifact("sched.spmd", expand_flags=("--lr-schedule", "cosine", "--warmup-steps", "1", "--decay-steps",
                                                       "3", "--clip-grad-norm", "0.5"))
    metrics = os.path.join(TMP, "metrics.jsonl")
    for _ in range(2):
        proc = subprocess.run([tool("spmd-run"), sched, "--nproc", "2", "--steps", "3", "--metrics", metrics],
                              capture_output=True, text=True, timeout=60)
    try:
        lines = [json.loads(line) for line in open(metrics)]
    except (OSError, ValueError) as e:
        lines = [str(e)]
    keys = {"step", "loss", "lr", "grad_norm", "ms", "samples_per_s"}
    report("--metrics appends a JSON line per step", proc.returncode == 0 and len(lines) == 6 and
           all(isinstance(m, dict) and keys <= set(m) for m in lines) and [m["step"] for m in lines] == [1, 2, 3] * 2 and
           lines[0]["lr"] == 0.005 and lines[1]["lr"] == 0.01 and lines[0]["samples_per_s"] > 0,
           proc.stderr + repr(lines[:2]))
    proc = subprocess.run([tool("spmd-run"), sched, "--steps", "1", "--metrics", "/nonexistent-dir/m.jsonl"],
                          capture_output=True, text=True, timeout=60)
    report("--metrics to a missing directory", proc.returncode == 1 and "step 1" not in proc.stdout and
           one_line_error(proc.stderr, "--metrics /nonexistent-dir/m.jsonl: cannot open for appending"), proc.stderr)

    # Gradients sent as bf16 on Gloo, which cannot sum them in LibTorch 1.13: every rank
    # stops at its first all-reduce with an error that says what to change.
    if torch.__version__.split(".")[0] == "1":
        bf16 = build_artifact("bf16.spmd", expand_flags=("--reduce-dtype", "bf16"))
        proc = subprocess.run([tool("spmd-run"), bf16, "--nproc", "2", "--steps", "1", "--timeout", "20"],
                              capture_output=True, text=True, timeout=60)
        report("--reduce-dtype bf16 on Gloo", proc.returncode == 1 and
               "Gloo cannot sum bf16 tensors; expand with --reduce-dtype f16 (or none), or run on CUDA" in proc.stderr,
               proc.stderr)

    # Truncated and altered artifacts.
    with open(step, "rb") as f:
        data = f.read()
    cut = os.path.join(TMP, "cut.spmd")
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2])
    altered = os.path.join(TMP, "altered.spmd")
    blob = bytearray(data)
    blob[len(blob) // 2] ^= 0xFF
    with open(altered, "wb") as f:
        f.write(bytes(blob))
    for name, path in (("truncated artifact", cut), ("altered artifact", altered)):
        proc = subprocess.run([tool("spmd-run"), path, "--steps", "1"], capture_output=True, text=True, timeout=60)
        report(name, proc.returncode == 1 and proc.stderr.count("\n") == 1 and "step 1" not in proc.stdout, proc.stderr)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
