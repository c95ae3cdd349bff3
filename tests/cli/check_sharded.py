"""Sharded data parallelism (spmd-split --shard) beyond parameter parity
(tests/parity/run_parity.py has that against DDP):

  - resume from a sharded checkpoint == an uninterrupted run, bit for bit
    (2 ranks, AdamW, unrolled, --shard optimizer; 4 ranks, Adam, unrolled,
    --shard parameters; 3 ranks, SGD with momentum, plain, --shard
    gradients), and from the newest step every rank holds when one rank's
    newest is missing; the merged checkpoint's parameters equal
    --save-params' (gathered from the ranks' shards under --shard parameters);
  - python3 -m spmd_checkpoint merge joins the ranks; the merged optimizer
    state equals ZeroRedundancyOptimizer's consolidated state_dict() after
    the same training (2 ranks, AdamW), and torch.optim loads it;
  - refusals in one line: another world size at run and at resume, a
    sharded checkpoint into an unsharded step, --shard without --world-size;
  - spmd-inspect --memory's model state per rank against the formula.

  check_sharded.py BIN_DIR        (run from the repository root; python3 with torch)
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch

BIN = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TMP = tempfile.mkdtemp()
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
passed = failed = 0

LM = ("samples/lm.pt", ["tokens:i64[4,16]", "targets:i64[4,16]"])
MLP = ("samples/mlp.pt", ["x:f32[8,100]"])
CNN = ("samples/cnn.pt", ["x:f32[8,3,16,16]", "y:f32[8,4]"])
ADAMW = ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-5"]


def tool(name):
    return os.path.join(BIN, name)


def path(name):
    return os.path.join(TMP, name)


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)[-3000:]), flush=True)


def stage(argv, data=None, check=True):
    proc = subprocess.run(argv, input=data, capture_output=True, timeout=300)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.decode()}")
    return proc


def pipeline(name, model, expand_flags, split_flags, unroll=None):
    sample, inputs = model
    specs = [arg for spec in inputs for arg in ("--input", spec)]
    graph = stage([tool("spmd-expand"), sample, *specs, *expand_flags]).stdout
    graph = stage([tool("spmd-split"), *split_flags], graph).stdout
    if unroll:
        graph = stage([tool("spmd-unroll"), "--iters", str(unroll)], graph).stdout
    stage([tool("spmd-lower"), "-o", path(name)], graph)
    return path(name)


def run(artifact, *flags, check=True):
    proc = subprocess.run([tool("spmd-run"), artifact, "--device", "cpu", *flags], capture_output=True, text=True,
                          timeout=300)
    if check and proc.returncode != 0:
        raise RuntimeError(f"spmd-run {' '.join(flags)} failed: {proc.stderr}")
    return proc


def identical(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def one_line_error(proc, tool_name, fragment):
    lines = [l for l in proc.stderr.strip().split("\n") if l]
    return proc.returncode == 1 and len(lines) >= 1 and lines[0].startswith(tool_name + ": error: ") and \
        fragment in lines[0] and "Traceback" not in proc.stderr


def make_lm_data(name, steps, ranks):
    g = torch.Generator().manual_seed(5)
    data = {n: torch.randint(0, 64, (steps, 4 * ranks, 16), generator=g) for n in ("tokens", "targets")}
    torch.save(data, path(name))
    return path(name)


def make_mlp_data(name, steps, ranks):
    g = torch.Generator().manual_seed(4)
    torch.save({"x": torch.randn(steps, 8 * ranks, 100, generator=g)}, path(name))
    return path(name)


def make_cnn_data(name, steps, ranks):
    g = torch.Generator().manual_seed(3)
    data = {"x": torch.randn(steps, 8 * ranks, 3, 16, 16, generator=g), "y": torch.randn(steps, 8 * ranks, 4,
                                                                                         generator=g)}
    torch.save(data, path(name))
    return path(name)


def resume_cases():
    cases = {
        "lm, AdamW, --shard optimizer, 2 ranks, unrolled": (
            pipeline("lm_opt.spmd", LM, ADAMW, ["--shard", "optimizer", "--world-size", "2", "--bucket-cap-mb",
                                                "0.01", "--first-bucket-cap-mb", "0.01"], unroll=8),
            make_lm_data("lm2.data.pt", 8, 2), 2),
        "mlp, Adam, --shard parameters, 4 ranks, unrolled": (
            pipeline("mlp_params.spmd", MLP, ["--optimizer", "adam", "--lr", "1e-2", "--eps", "1e-2"],
                     ["--shard", "parameters", "--world-size", "4", "--bucket-cap-mb", "0.05",
                      "--first-bucket-cap-mb", "0.05"], unroll=8),
            make_mlp_data("mlp4.data.pt", 8, 4), 4),
        "cnn, SGD momentum, --shard gradients, 3 ranks": (
            pipeline("cnn_grad.spmd", CNN, ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
                     ["--shard", "gradients", "--world-size", "3"]),
            make_cnn_data("cnn3.data.pt", 8, 3), 3),
    }
    for name, (artifact, data, ranks) in cases.items():
        common = ["--nproc", str(ranks), "--data", data]
        run(artifact, *common, "--steps", "8", "--save-params", path("full.pt"))
        full = torch.load(path("full.pt"))
        root = path(name.split(",")[0] + ".ckpt")
        run(artifact, *common, "--steps", "4", "--checkpoint", root, "--save-params", path("four.pt"))
        index = json.load(open(os.path.join(root, "index.json")))
        report(f"{name}: index.json and one folder per rank",
               index["world_size"] == ranks and index["ranks"] == [f"rank-{r:05d}" for r in range(ranks)] and
               all(os.path.isdir(os.path.join(root, r, "step-00000004")) for r in index["ranks"]), index)
        run(artifact, *common, "--steps", "8", "--resume", root, "--save-params", path("resumed.pt"))
        report(f"{name}: 4 steps, resumed to 8 == 8 steps", identical(full, torch.load(path("resumed.pt"))))
        merged = root + ".merged"
        proc = subprocess.run([sys.executable, "-m", "spmd_checkpoint", "merge", root, merged], capture_output=True,
                              text=True, env=ENV)
        model = torch.load(os.path.join(merged, "model.pt")) if proc.returncode == 0 else {}
        four = torch.load(path("four.pt"))
        report(f"{name}: the merged model.pt == --save-params after 4 steps",
               all(k in model and torch.equal(model[k], four[k]) for k in four), proc.stderr)
        # A crash after rank 0 wrote step 6 and before the others did: the resume takes step 4.
        every = path(name.split(",")[0] + ".every")
        run(artifact, *common, "--steps", "6", "--checkpoint", every, "--checkpoint-every", "2", "--keep", "3")
        for r in range(1, ranks):
            shutil.rmtree(os.path.join(every, f"rank-{r:05d}", "step-00000006"))
        run(artifact, *common, "--steps", "8", "--resume", every, "--save-params", path("from4.pt"))
        report(f"{name}: resumed at the newest step every rank holds (4) == 8 steps",
               identical(full, torch.load(path("from4.pt"))))
    return cases


def zero_redundancy_state():
    """Our merged optimizer state against ZeroRedundancyOptimizer's, after 5 AdamW steps on 2 ranks."""
    ref, zero, data = path("zero_ref.pt"), path("zero_opt.pt"), path("zero_data.pt")
    stage([sys.executable, os.path.join(ROOT, "tests", "parity", "ddp_reference.py"), "--sample", "lm",
           *ADAMW, "--nproc", "2", "--steps", "5", "--data", data, "--out", ref, "--seed", "1",
           "--model-pt", "samples/lm.pt", "--zero-redundancy", zero])
    artifact = pipeline("lm_zero.spmd", LM, ADAMW, ["--shard", "optimizer", "--world-size", "2"])
    root = path("lm_zero.ckpt")
    run(artifact, "--nproc", "2", "--data", data, "--steps", "5", "--checkpoint", root,
        "--save-params", path("ours.pt"))
    merged = path("lm_zero.merged")
    proc = subprocess.run([sys.executable, "-m", "spmd_checkpoint", "merge", root, merged], capture_output=True,
                          text=True, env=ENV)
    report("spmd_checkpoint merge joins the ranks", proc.returncode == 0, proc.stderr)
    if proc.returncode != 0:
        return
    ours, theirs = torch.load(os.path.join(merged, "optimizer.pt")), torch.load(zero)
    worst, mismatch = 0.0, []
    for idx, fields in theirs["state"].items():
        for key, value in fields.items():
            mine = ours["state"][idx][key]
            if mine.shape != value.shape:
                mismatch.append((idx, key, tuple(mine.shape), tuple(value.shape)))
                continue
            worst = max(worst, (mine.double() - value.double()).abs().max().item())
    report("merged optimizer state == ZeroRedundancyOptimizer's consolidated state (atol 1e-6)",
           not mismatch and len(ours["state"]) == len(theirs["state"]) and worst <= 1e-6, (mismatch, worst))
    params = torch.load(ref)
    model = torch.load(os.path.join(merged, "model.pt"))
    report("merged model.pt == ZeroRedundancyOptimizer's parameters (atol 1e-6)",
           all(torch.allclose(model[k], params[k], rtol=1e-4, atol=1e-6) for k in params))
    # torch.optim takes the merged state as its own.
    module = torch.jit.load("samples/lm.pt")
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2, eps=1e-5)
    try:
        opt.load_state_dict(ours)
        report("torch.optim.AdamW loads the merged optimizer.pt", True)
    except Exception as e:
        report("torch.optim.AdamW loads the merged optimizer.pt", False, e)


def refusals(cases):
    artifact, data, ranks = cases["lm, AdamW, --shard optimizer, 2 ranks, unrolled"]
    proc = run(artifact, "--nproc", "3", "--data", make_lm_data("lm3.data.pt", 2, 3), "--steps", "2", check=False)
    report("a step compiled for 2 ranks refuses 3", one_line_error(proc, "spmd-run", "compiled for 2 ranks"),
           proc.stderr)
    four = pipeline("lm_opt4.spmd", LM, ADAMW, ["--shard", "optimizer", "--world-size", "4"])
    proc = run(four, "--nproc", "4", "--data", make_lm_data("lm4.data.pt", 8, 4), "--steps", "8", "--resume",
               path("lm.ckpt"), check=False)
    report("a sharded checkpoint of 2 ranks refuses a resume on 4",
           one_line_error(proc, "spmd-run", "sharded run of 2 ranks"), proc.stderr)
    swapped = path("lm_swapped.ckpt")
    shutil.copytree(path("lm.ckpt"), swapped)
    os.rename(os.path.join(swapped, "rank-00000"), os.path.join(swapped, "swap"))
    os.rename(os.path.join(swapped, "rank-00001"), os.path.join(swapped, "rank-00000"))
    os.rename(os.path.join(swapped, "swap"), os.path.join(swapped, "rank-00001"))
    proc = run(artifact, "--nproc", "2", "--data", data, "--steps", "8", "--resume", swapped, check=False)
    report("a resume from swapped rank folders is refused (issue 57)",
           one_line_error(proc, "spmd-run", "'s shards, not rank ") and "swapped or copied" in proc.stderr, proc.stderr)
    plain = pipeline("lm_plain.spmd", LM, ADAMW, [])
    proc = run(plain, "--nproc", "2", "--data", data, "--steps", "8", "--resume", path("lm.ckpt"), check=False)
    report("a sharded checkpoint refuses an unsharded step", one_line_error(proc, "spmd-run", "sharded run's"),
           proc.stderr)
    run(plain, "--nproc", "2", "--data", data, "--steps", "8", "--resume", path("lm.ckpt"), "--resume-weights-only")
    report("--resume-weights-only takes a sharded checkpoint's weights into an unsharded step", True)
    expanded = stage([tool("spmd-expand"), LM[0], "--input", LM[1][0], "--input", LM[1][1], *ADAMW]).stdout
    proc = subprocess.run([tool("spmd-split"), "--shard", "optimizer"], input=expanded, capture_output=True,
                          text=False)
    proc.stderr = proc.stderr.decode()
    report("--shard without --world-size is refused", one_line_error(proc, "spmd-split", "--world-size"), proc.stderr)


def merge_refusals():
    """Issue 57: the merge tool checked no CRC (a damaged optimizer shard was merged, exit 0),
    took a member from another rank, and answered index.json = [], a missing 'parameters'
    and a missing OUT folder with tracebacks. Each is one line, exit 1, and no OUT."""
    source = path("lm_zero.ckpt")  # zero_redundancy_state's: 2 ranks, AdamW, step 5

    def index_list(root):
        json.dump([], open(os.path.join(root, "index.json"), "w"))

    def index_without_parameters(root):
        index = json.load(open(os.path.join(root, "index.json")))
        del index["parameters"]
        json.dump(index, open(os.path.join(root, "index.json"), "w"))

    def flipped_optimizer_byte(root):
        import zipfile
        name = os.path.join(root, "rank-00001", "step-00000005", "optimizer.pt")
        raw = bytearray(open(name, "rb").read())
        with zipfile.ZipFile(name) as z:
            big = max(z.infolist(), key=lambda i: i.file_size)  # a tensor's bytes
        # Its data follows the local header (30 bytes, the name, the extra field).
        start = big.header_offset + 30 + int.from_bytes(raw[big.header_offset + 26:big.header_offset + 28], "little") + \
            int.from_bytes(raw[big.header_offset + 28:big.header_offset + 30], "little")
        raw[start + big.file_size // 2] ^= 0x40
        open(name, "wb").write(bytes(raw))

    def rank1_optimizer_in_rank0(root):
        shutil.copyfile(os.path.join(root, "rank-00001", "step-00000005", "optimizer.pt"),
                        os.path.join(root, "rank-00000", "step-00000005", "optimizer.pt"))

    def edited_rank_step(root):
        name = os.path.join(root, "rank-00001", "step-00000005", "manifest.json")
        manifest = json.load(open(name))
        manifest["step"] = 4
        json.dump(manifest, open(name, "w"))

    def swapped_rank_folders(root):
        os.rename(os.path.join(root, "rank-00000"), os.path.join(root, "swap"))
        os.rename(os.path.join(root, "rank-00001"), os.path.join(root, "rank-00000"))
        os.rename(os.path.join(root, "swap"), os.path.join(root, "rank-00001"))

    cases = [("index.json is []", index_list, None, r"index\.json: not an spmd sharded checkpoint index"),
             ("swapped rank folders", swapped_rank_folders, None,
              r"rank-00000/step-00000005/manifest\.json: holds rank 1's shards, not rank 0's: the rank folders were "
              r"swapped or copied"),
             ("index.json without parameters", index_without_parameters, None, r"index\.json: no 'parameters'"),
             ("a damaged optimizer shard", flipped_optimizer_byte, None,
              r"rank-00001/step-00000005/optimizer\.pt: damaged: member '.*' does not match its CRC-32"),
             ("rank 1's optimizer.pt in rank 0's folder", rank1_optimizer_in_rank0, None,
              r"rank-00000/step-00000005/optimizer\.pt: is not the file its manifest\.json was written with.*"),
             ("an edited rank manifest", edited_rank_step, None,
              r"rank-00001/step-00000005/manifest\.json: step 4, but the folder is step-00000005"),
             ("OUT in a missing folder", None, path("no/such/folder/out"), r".*/no/such/folder/out: its folder .* does not exist")]
    for k, (name, damage, out, pattern) in enumerate(cases):
        root = path(f"merge_refusal_{k}.ckpt")
        shutil.copytree(source, root)
        if damage:
            damage(root)
        out = out or root + ".merged"
        proc = subprocess.run([sys.executable, "-m", "spmd_checkpoint", "merge", root, out], capture_output=True,
                              text=True, env=ENV)
        lines = proc.stderr.strip().split("\n")
        report(f"spmd_checkpoint merge: {name}: refused in one line", proc.returncode == 1 and len(lines) == 1 and
               re.fullmatch(r"spmd_checkpoint: error: .*" + pattern, lines[0]) is not None and not os.path.exists(out),
               proc.stderr)


def memory_formula():
    """Per-rank model state of the memory plan against the formula: parameters
    4P bytes, gradients 4P/N and Adam's moments 8P/N, P counted in shards of
    ceil(rows / N) rows (the padding), plus Adam's 4-byte step per parameter."""
    expanded = stage([tool("spmd-expand"), LM[0], "--input", LM[1][0], "--input", LM[1][1], *ADAMW]).stdout
    tensors = list(torch.jit.load(LM[0]).parameters())
    params = sum(t.numel() for t in tensors)
    for world in (1, 2, 4, 8):
        flags = ["--shard", "gradients", "--world-size", str(world)] if world > 1 else []
        split = stage([tool("spmd-split"), *flags], expanded).stdout
        plan = json.loads(stage([tool("spmd-inspect"), "-", "--memory", "--json"], split).stdout)["model_state"]
        sharded = 0
        for t in tensors:
            rows = t.shape[0] if t.dim() else 1
            sharded += -(-rows // world) * (t.numel() // rows)
        want = {"parameters": 4 * params, "gradients": 4 * sharded, "optimizer_state": 8 * sharded + 4 * len(tensors)}
        report(f"--memory model state on {world} rank(s): parameters 4P, gradients 4P/N, Adam state 8P/N "
               f"(P = {params}, {sharded} a rank with padding)", plan == want, (plan, want))
        if world > 1:
            buckets = json.loads(stage([tool("spmd-inspect"), "-", "--buckets", "--json"], split).stdout)
            shards = sum(b["shard_bytes"] for b in buckets)
            report(f"--buckets' shard bytes on {world} ranks add up to the gradients a rank holds", shards == 4 * sharded,
                   (shards, 4 * sharded))


def main():
    try:
        cases = resume_cases()
        zero_redundancy_state()
        merge_refusals()
        refusals(cases)
        memory_formula()
    except Exception as e:
        report("check_sharded.py ran through", False, e)
    print(f"{passed} passed, {failed} failed")
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
