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
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def children_of(pid):
    return [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]


def running(pid):
    """Whether `pid` is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pids, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def start_launcher(step, *extra, timeout="30"):
    """spmd-run --nproc 2, training until stopped; returns (process, rank pids) once step 3 ran."""
    proc = subprocess.Popen([tool("spmd-run"), step, "--nproc", "2", "--steps", "100000", "--timeout", timeout, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_step(proc, 3)
    return proc, children_of(proc.pid)


def finish(proc, limit):
    """Waits up to `limit` s for proc; returns (exit code or None if it hung, seconds, stderr)."""
    start = time.time()
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, time.time() - start, proc.stderr.read().decode()
    return proc.returncode, time.time() - start, proc.stderr.read().decode()


def error_lines(stderr):
    return [l for l in stderr.split("\n") if l]


def check_supervision(step):
    """spmd-run --nproc: the launcher ends its whole group, whatever a rank or the user does."""
    # A hung rank (stopped): the group ends well before the peers' --timeout of 30 s.
    proc, ranks = start_launcher(step)
    if len(ranks) == 2:
        os.kill(ranks[1], signal.SIGSTOP)
    code, took, err = finish(proc, 45)
    report("stopped rank under --nproc", code == 1 and took < 12 and gone_within(ranks, 2) and
           len(error_lines(err)) == 1 and "rank 1 of 2 failed first: it was stopped (SIGSTOP)" in err,
           f"exit {code} after {took:.1f}s, ranks left {[r for r in ranks if running(r)]}: {err!r}")
    for r in ranks:
        if running(r):
            os.kill(r, signal.SIGKILL)

    # SIGTERM (a scheduler's) and SIGINT to the launcher reach the ranks.
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc, ranks = start_launcher(step)
        proc.send_signal(sig)
        code, took, err = finish(proc, 30)
        report(f"{sig.name} to the launcher", code == 1 and took < 8 and gone_within(ranks, 2) and
               error_lines(err) == [l for l in error_lines(err) if f"interrupted by signal {sig.value}" in l] and
               len(error_lines(err)) == 1, f"exit {code} after {took:.1f}s, ranks left "
               f"{[r for r in ranks if running(r)]}: {err!r}")
        for r in ranks:
            if running(r):
                os.kill(r, signal.SIGKILL)

    # A launcher killed outright takes its ranks with it.
    proc, ranks = start_launcher(step)
    proc.kill()
    proc.wait()
    report("SIGKILL to the launcher", len(ranks) == 2 and gone_within(ranks, 5),
           f"ranks left {[r for r in ranks if running(r)]}")
    for r in ranks:
        if running(r):
            os.kill(r, signal.SIGKILL)


def check_oddities():
    """Graphs that run but would surprise: each says so."""
    # A forward graph (TorchScript, lowered in-process): a note that nothing trains.
    proc = subprocess.run([tool("spmd-run"), "samples/mlp.pt", "--input", "x:f32[8,100]", "--steps", "1"],
                          capture_output=True, text=True, timeout=120)
    report("forward graph: a note", proc.returncode == 0 and error_lines(proc.stderr) == [
        "spmd-run: note: samples/mlp.pt: /updates: the graph updates no parameter (a forward graph?): it runs, but "
        "trains nothing; spmd-expand makes a train step of it"], proc.stderr)

    with open("tests/golden/inspect/mlp.json") as f:
        forward = json.load(f)
    # No outputs: no loss, said as much (was "loss 0").
    doc = dict(forward, outputs=[])
    path = os.path.join(TMP, "nooutputs.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    proc = subprocess.run([tool("spmd-run"), path, "--steps", "1"], capture_output=True, text=True, timeout=120)
    report("no outputs: no loss", proc.returncode == 0 and "step 1/1  no loss (the graph has no outputs)" in proc.stdout
           and "loss 0" not in proc.stdout and "/outputs: the graph has no outputs: there is no loss to print" in
           proc.stderr, proc.stdout + proc.stderr)

    # A relative weights path is the dump's, not the working directory's.
    beside = os.path.join(TMP, "beside")
    os.makedirs(beside, exist_ok=True)
    with open("samples/mlp.pt", "rb") as src, open(os.path.join(beside, "weights.pt"), "wb") as dst:
        dst.write(src.read())
    doc = dict(forward, weights={"file": "weights.pt", "format": "torchscript"})
    path = os.path.join(beside, "fwd.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    proc = subprocess.run([tool("spmd-run"), path, "--steps", "1"], capture_output=True, text=True, timeout=120)
    report("relative weights path beside the dump", proc.returncode == 0 and "step 1/1  loss" in proc.stdout,
           proc.stderr)


def check_newcomer(step):
    """The progress bar on a terminal; make demo's fixed data."""
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([tool("spmd-run"), step, "--steps", "30"], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    proc.wait(timeout=60)
    last = shown.decode(errors="replace").replace("\r\n", "\n").split("\r")[-1]  # the tty writes \n as \r\n
    report("progress bar shows loss, rate, ETA", proc.returncode == 0 and
           re.search(r"\] 30/30  loss \S+  \S+ steps/s  ETA 0:00", last) is not None, repr(last))

    # make demo: every step on one fixed batch (was fresh random inputs), so the loss falls.
    with open("Makefile") as f:
        runs = [line for line in f if "spmd-run " in line]
    report("make demo trains on --data", len(runs) == 2 and all("--data $(BUILD)/" in r for r in runs), repr(runs))
    subprocess.run([sys.executable, "samples/demo_data.py", TMP], check=True)
    cnn = build_artifact("cnn.spmd", sample="samples/cnn.pt", inputs=("x:f32[8,3,16,16]", "y:f32[8,4]"))
    proc = subprocess.run([tool("spmd-run"), cnn, "--nproc", "2", "--steps", "20", "--json", "--data",
                           os.path.join(TMP, "cnn_data.pt")], capture_output=True, text=True, timeout=120)
    try:
        losses = json.loads(proc.stdout)["losses"]
    except (ValueError, KeyError):
        losses = []
    report("demo data: the loss falls", proc.returncode == 0 and len(losses) == 20 and
           all(b < a for a, b in zip(losses, losses[1:])),
           proc.stderr + repr(losses))


def check_launcher_environment(step):
    """Issue 57: a partial launcher environment trained as one rank and exited 0;
    WORLD_SIZE=1000000 hung past --timeout, 4096 listed thousands of ranks; a port
    past 65535 was taken; an unresolvable MASTER_ADDR answered after twice --timeout.
    Each is now refused at once (or, for the missing ranks, within --timeout) in one line."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    port = str(free_port())
    cases = [
        ("only WORLD_SIZE", dict(WORLD_SIZE="2"), "RANK: is not set where the environment sets WORLD_SIZE"),
        ("only RANK", dict(RANK="1"), "WORLD_SIZE: is not set where the environment sets RANK"),
        ("an empty RANK", dict(RANK="", WORLD_SIZE="2", MASTER_PORT=port), "RANK: is empty where the environment sets"),
        ("only LOCAL_RANK", dict(LOCAL_RANK="0"), "RANK: is not set where the environment sets LOCAL_RANK"),
        ("a world of a million", dict(RANK="0", WORLD_SIZE="1000000", MASTER_PORT=port),
         "WORLD_SIZE: 1000000 ranks: at most 65536"),
        ("port 99999", dict(RANK="0", WORLD_SIZE="2", MASTER_PORT="99999"), "MASTER_PORT: port 99999 is not in 1-65535"),
        ("an unresolvable MASTER_ADDR", dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="no-such-host.invalid",
                                             MASTER_PORT=port), "MASTER_ADDR: cannot resolve 'no-such-host.invalid'"),
    ]
    for name, env, fragment in cases:
        start = time.time()
        proc = subprocess.run([tool("spmd-run"), step, "--steps", "1", "--timeout", "5"], env=dict(base, **env),
                              capture_output=True, text=True, timeout=60)
        took = time.time() - start
        report(f"launcher environment: {name}", proc.returncode == 1 and took < 4 and
               one_line_error(proc.stderr, fragment), f"exit {proc.returncode} after {took:.1f}s: {proc.stderr!r}")
    # Thousands of ranks that never come: named by count, with a few of them, within --timeout.
    start = time.time()
    proc = subprocess.run([tool("spmd-run"), step, "--steps", "1", "--timeout", "3"],
                          env=dict(base, RANK="0", WORLD_SIZE="4096", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                          capture_output=True, text=True, timeout=60)
    took = time.time() - start
    report("4095 ranks that never join", proc.returncode == 1 and took < 6.5 and one_line_error(
        proc.stderr, "4095 ranks of 4096 (1, 2, 3, 4, 5, 6, 7, 8, ... among them) did not join within 3 s"),
        f"exit {proc.returncode} after {took:.1f}s: {proc.stderr!r}")


def check_same_run(step):
    """Issue 57: rank 0 on an SGD step and rank 1 on an AdamW step of the same model
    (or on another --steps) trained together and exited 0. Each rank now presents its
    artifact's fingerprint and the flags that change the run at the join: both stop,
    within --timeout, naming the other rank and what differs."""
    adamw = os.path.join(TMP, "mlp.adamw.spmd")
    expand = subprocess.run([tool("spmd-expand"), "samples/mlp.pt", "--input", "x:f32[8,100]", "--optimizer", "adamw",
                             "--lr", "0.01"], capture_output=True, check=True)
    split = subprocess.run([tool("spmd-split")], input=expand.stdout, capture_output=True, check=True)
    subprocess.run([tool("spmd-lower"), "-o", adamw], input=split.stdout, capture_output=True, check=True)
    for name, args, what in (("another artifact", ([step, "--steps", "2"], [adamw, "--steps", "2"]),
                              "the artifact's fingerprint"),
                             ("another --steps", ([step, "--steps", "2"], [step, "--steps", "3"]), "--steps 3 there, 2 here")):
        port = free_port()
        start = time.time()
        procs = [subprocess.Popen([tool("spmd-run"), *args[r], "--timeout", "10"], env=rank_env(r, 2, port),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(2)]
        errs = [p.communicate(timeout=60)[1] for p in procs]
        took = time.time() - start
        ok = all(p.returncode == 1 for p in procs) and took < 10 and \
            one_line_error(errs[0], "rank 1 runs a different step from rank 0: ") and what in errs[0] and \
            one_line_error(errs[1], "rank 0 runs a different step from rank 1: ")
        report(f"ranks of {name} refuse each other", ok,
               f"exits {[p.returncode for p in procs]} after {took:.1f}s: {errs!r}")


def one_line_error(stderr, fragment):
    lines = [l for l in stderr.strip().split("\n") if l]
    return len(lines) >= 1 and all(l.startswith("spmd-run: error: ") for l in lines) and fragment in stderr


def main():
    step = build_artifact("mlp.spmd")

    # A peer that never joins: rank 0 of 2 alone gives up after --timeout (not twice
    # that), naming the missing rank; so does rank 1 alone, whose store never answers.
    for rank, fragment in ((0, "rank 1 of 2 did not join within 4 s"), (1, "rank 0's store did not answer within 4 s")):
        start = time.time()
        proc = subprocess.run([tool("spmd-run"), step, "--steps", "2", "--timeout", "4"],
                              env=rank_env(rank, 2, free_port()), capture_output=True, text=True, timeout=60)
        took = time.time() - start
        # Under 2 timeouts, with LibTorch's start-up on a loaded machine.
        report(f"peer never joins rank {rank}", proc.returncode == 1 and took < 7.5 and
               one_line_error(proc.stderr, f"rank {rank}: ") and fragment in proc.stderr,
               f"exit {proc.returncode} after {took:.1f}s: {proc.stderr!r}")

    # A busy port.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([tool("spmd-run"), step, "--steps", "1", "--timeout", "5"], env=rank_env(0, 2, port),
                              capture_output=True, text=True, timeout=60)
        report("busy port", proc.returncode == 1 and one_line_error(proc.stderr, "busy"), proc.stderr)

    # Another job's port (issue 44): a rank of job B given the MASTER_PORT of job A,
    # whose store answers and whose ranks have joined, says so within its --timeout,
    # naming the address, the port and both jobs.
    port = free_port()
    job_a = [subprocess.Popen([tool("spmd-run"), step, "--steps", "100000", "--timeout", "30"],
                              env=dict(rank_env(r, 2, port), TORCHELASTIC_RUN_ID="job-a"),
                              stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for r in range(2)]
    wait_for_step(job_a[0], 2)
    start = time.time()
    proc = subprocess.run([tool("spmd-run"), step, "--steps", "2", "--timeout", "5"],
                          env=dict(rank_env(1, 2, port), TORCHELASTIC_RUN_ID="job-b"), capture_output=True, text=True,
                          timeout=60)
    took = time.time() - start
    for p in job_a:
        p.kill()
        p.wait()
    report("another job's port", proc.returncode == 1 and took < 7.5 and one_line_error(
        proc.stderr, f"MASTER_ADDR:MASTER_PORT 127.0.0.1:{port}: the store there serves another job "
        "(TORCHELASTIC_RUN_ID=job-a; this rank's is TORCHELASTIC_RUN_ID=job-b): give each job its own MASTER_PORT"),
        f"exit {proc.returncode} after {took:.1f}s: {proc.stderr!r}")

    check_launcher_environment(step)
    check_same_run(step)
    check_supervision(step)
    check_oddities()
    check_newcomer(step)

    # A rank killed mid-run under --nproc: the launcher stops the others and names it,
    # in one line (rank 0's failed collective is no news).
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
        report("rank killed under --nproc", proc.returncode == 1 and error_lines(err) == [
            "spmd-run: error: rank 1 of 2 failed first: it was killed by signal 9 (Killed); the other ranks were stopped"],
            err)
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

    # Bad data: each refused before step 1, naming the input; with 2 ranks, both
    # fail alike, and the error is printed once, with the launcher's line after it.
    def data_case(name, data, fragment, nproc="2"):
        path = os.path.join(TMP, name + ".pt")
        torch.save(data, path)
        proc = subprocess.run([tool("spmd-run"), step, "--nproc", nproc, "--steps", "1", "--data", path],
                              capture_output=True, text=True, timeout=60)
        lines = error_lines(proc.stderr)
        once = len(lines) == 1 if nproc == "1" else (len(lines) == 2 and fragment in lines[0] and
                                                     " of 2 failed first: it exited with code 1" in lines[1])
        report(name, proc.returncode == 1 and "step 1" not in proc.stdout and fragment in proc.stderr and once,
               proc.stderr)

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
    # Only rank 1's rows are bad: its error, whole, then the launcher's line; rank 0,
    # whose all-reduce fails for want of rank 1, says nothing.
    half = os.path.join(TMP, "bad_rank1_tokens.pt")
    tokens = torch.zeros(1, 8, 16, dtype=torch.int64)
    tokens[:, 4:] = 1000
    torch.save({"tokens": tokens, "targets": torch.zeros(1, 8, 16, dtype=torch.int64)}, half)
    proc = subprocess.run([tool("spmd-run"), lm, "--nproc", "2", "--steps", "1", "--data", half, "--timeout", "20"],
                          capture_output=True, text=True, timeout=60)
    lines = error_lines(proc.stderr)
    report("one report per failure", proc.returncode == 1 and len(lines) == 2 and
           re.fullmatch(r"spmd-run: error: rank 1: .*: /nodes/\d+ \(aten::embedding\): index out of range in self",
                        lines[0]) is not None and
           lines[1] == "spmd-run: error: rank 1 of 2 failed first: it exited with code 1; the other ranks were stopped",
           proc.stderr)

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
    # --trace: the profiler's events of the timed steps on rank 0, as a Chrome trace that
    # bench/trace_kernels.py reads (on CPU it finds no device work to sum).
    trace = os.path.join(TMP, "trace.json")
    proc = subprocess.run([tool("spmd-run"), step, "--nproc", "2", "--steps", "3", "--warmup", "1", "--trace", trace],
                          capture_output=True, text=True, timeout=60)
    try:
        events = json.load(open(trace))
    except (OSError, ValueError) as e:
        events = {"error": str(e)}
    names = {e.get("name") for e in events.get("traceEvents", [])}
    summary = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "trace_kernels.py"), trace],
                             capture_output=True, text=True, timeout=60)
    report("--trace writes a Chrome trace", proc.returncode == 0 and events.get("spmd") == {"steps": 2, "device": "cpu"}
           and "aten::linear" in names and "aten::mm" in names and
           all(e.get("ph") == "X" and e.get("dur", -1) >= 0 for e in events["traceEvents"]) and summary.returncode == 0
           and "2 steps on cpu" in summary.stdout, proc.stderr + str(events)[:300] + summary.stderr)
    for flag in ("--profile", "--save-params", "--trace"):
        proc = subprocess.run([tool("spmd-run"), step, "--steps", "1", flag, "/nonexistent-dir/out"],
                              capture_output=True, text=True, timeout=60)
        report(flag + " to a missing directory", proc.returncode == 1 and "step 1" not in proc.stdout and
               one_line_error(proc.stderr, "cannot write to /nonexistent-dir"), proc.stderr)

    # Files written after the last step are checked before step 1, by making one beside
    # them: an existing directory, a path under a regular file, /proc (root may write
    # everywhere else, so access() is not a test).
    regular = os.path.join(TMP, "regular.txt")
    open(regular, "w").close()
    for flag in ("--save-params", "--profile", "--metrics", "--trace"):
        for target, fragment in ((TMP, "is a directory"), (os.path.join(regular, "out"), "Not a directory"),
                                 ("/proc/spmd-out", "/proc")):
            proc = subprocess.run([tool("spmd-run"), step, "--steps", "1", flag, target], capture_output=True, text=True,
                                  timeout=60)
            report(f"{flag} {target}", proc.returncode == 1 and "step 1" not in proc.stdout and
                   one_line_error(proc.stderr, f"{flag} {target}") and fragment.lower() in proc.stderr.lower(),
                   proc.stderr)

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
