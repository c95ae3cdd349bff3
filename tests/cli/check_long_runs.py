"""spmd-run's long-run features against oracles: checkpoints and resume
(bit for bit against an uninterrupted run, 2 Gloo ranks, plain and unrolled
artifacts, Adam with a schedule and SGD with momentum), the files PyTorch
reads (against torch.optim's own training of the same module), faults while
writing (SIGKILL, a write that fails), and the data sources (.npz, a folder of
.npy, rows, token streams) against the torch.save dict.

  check_long_runs.py BIN_DIR        (run from the repository root; python3 with torch)
"""
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

BIN = sys.argv[1]
TMP = tempfile.mkdtemp()
passed = failed = 0


def tool(name):
    return os.path.join(BIN, name)


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)[-3000:]), flush=True)


def path(name):
    return os.path.join(TMP, name)


def pipeline(name, sample, inputs, expand_flags, split_flags=(), unroll=None):
    """expand | split | [unroll] | lower into TMP/name."""
    specs = [arg for spec in inputs for arg in ("--input", spec)]
    stage = subprocess.run([tool("spmd-expand"), sample, *specs, *expand_flags], capture_output=True, check=True).stdout
    stage = subprocess.run([tool("spmd-split"), *split_flags], input=stage, capture_output=True, check=True).stdout
    if unroll:
        stage = subprocess.run([tool("spmd-unroll"), "--iters", str(unroll)], input=stage, capture_output=True,
                               check=True).stdout
    subprocess.run([tool("spmd-lower"), "-o", path(name)], input=stage, capture_output=True, check=True)
    return path(name)


def run(artifact, *flags, check=True, **kw):
    proc = subprocess.run([tool("spmd-run"), artifact, "--device", "cpu", *flags], capture_output=True, text=True,
                          timeout=300, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"spmd-run {' '.join(flags)} failed: {proc.stderr}")
    return proc


def load(p):
    return torch.load(p)


def identical(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def one_line_error(stderr, fragment):
    lines = [l for l in stderr.strip().split("\n") if l]
    return len(lines) == 1 and lines[0].startswith("spmd-run: error: ") and fragment in lines[0]


def folders(root):
    return sorted(f for f in os.listdir(root) if f.startswith("step-"))


# ---- checkpoints ------------------------------------------------------------------

MLP = ("samples/mlp.pt", ["x:f32[8,100]"])
CNN = ("samples/cnn.pt", ["x:f32[8,3,16,16]", "y:f32[8,4]"])


def make_data(name, shapes, steps, ranks):
    g = torch.Generator().manual_seed(3)
    data = {n: torch.randn(steps, s[0] * ranks, *s[1:], generator=g) for n, s in shapes.items()}
    torch.save(data, path(name))
    return path(name), data


def resume_cases():
    mlp_data, _ = make_data("mlp.data.pt", {"x": (8, 100)}, 5, 2)
    cnn_data, _ = make_data("cnn.data.pt", {"x": (8, 3, 16, 16), "y": (8, 4)}, 5, 2)
    artifacts = {
        # Adam with a cosine schedule, several buckets, unrolled (the last
        # bucket's all-reduce and update move to the next iteration).
        "mlp unrolled, Adam, cosine": (pipeline("mlp_unrolled.spmd", *MLP, [
            "--optimizer", "adam", "--lr", "1e-2", "--eps", "1e-2", "--lr-schedule", "cosine", "--warmup-steps", "2",
            "--decay-steps", "6", "--min-lr", "1e-3"], ["--bucket-cap-mb", "0.05", "--first-bucket-cap-mb", "0.05"],
            unroll=8), mlp_data),
        # SGD with momentum (its first step differs) and a step schedule, BatchNorm buffers, plain.
        "cnn plain, SGD momentum, step schedule": (pipeline("cnn_plain.spmd", *CNN, [
            "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--lr-schedule", "step", "--step-size", "2",
            "--gamma", "0.5"]), cnn_data),
    }
    for name, (artifact, data) in artifacts.items():
        common = ["--nproc", "2", "--data", data]
        run(artifact, *common, "--steps", "8", "--save-params", path("full.pt"))
        full = load(path("full.pt"))
        root = path(name.split()[0] + ".ckpt")
        run(artifact, *common, "--steps", "3", "--checkpoint", root)
        run(artifact, *common, "--steps", "8", "--resume", root, "--save-params", path("resumed.pt"))
        report(f"{name}: 3 steps, resumed to 8 == 8 steps", identical(full, load(path("resumed.pt"))))

        every = path(name.split()[0] + ".every")
        run(artifact, *common, "--steps", "8", "--checkpoint", every, "--checkpoint-every", "2", "--keep", "2",
            "--save-params", path("every.pt"))
        report(f"{name}: checkpoints every 2 steps change no bits", identical(full, load(path("every.pt"))))
        latest = open(os.path.join(every, "latest")).read().strip()
        report(f"{name}: --keep 2 keeps the newest two", folders(every) == ["step-00000006", "step-00000008"] and
               latest == "step-00000008", (folders(every), latest))
        run(artifact, *common, "--steps", "8", "--resume", os.path.join(every, "step-00000006"), "--save-params",
            path("from6.pt"))
        report(f"{name}: resumed from the step-6 folder == 8 steps", identical(full, load(path("from6.pt"))))
        model = load(os.path.join(every, "step-00000008", "model.pt"))
        report(f"{name}: the checkpoint's model.pt holds the trained parameters",
               all(torch.equal(model[k], full[k]) for k in full))
    return artifacts


def pytorch_reads_checkpoint():
    """model.pt and optimizer.pt against torch.optim.Adam training the same TorchScript module on 1 rank."""
    artifact = pipeline("mlp_adam.spmd", *MLP, ["--optimizer", "adam", "--lr", "1e-2", "--eps", "1e-2"])
    data, tensors = make_data("mlp1.data.pt", {"x": (8, 100)}, 3, 1)
    root = path("adam.ckpt")
    run(artifact, "--steps", "3", "--data", data, "--checkpoint", root)
    folder = os.path.join(root, "step-00000003")
    model = torch.jit.load(MLP[0])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-2)
    for s in range(3):
        opt.zero_grad()
        model(tensors["x"][s]).backward()
        opt.step()
    ours = load(os.path.join(folder, "model.pt"))
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    report("model.pt: named_parameters() names, in order", list(ours) == names, list(ours)[:4])
    close = lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    report("model.pt: the parameters torch.optim.Adam trains", all(close(ours[n], p) for n, p in model.named_parameters()))
    saved = load(os.path.join(folder, "optimizer.pt"))
    theirs = opt.state_dict()
    same_layout = saved["param_groups"][0]["params"] == theirs["param_groups"][0]["params"] and \
        saved["state"].keys() == theirs["state"].keys() and \
        all(saved["state"][i].keys() == theirs["state"][i].keys() for i in theirs["state"])
    report("optimizer.pt: torch.optim's state_dict() layout", same_layout, (saved["param_groups"], theirs["param_groups"]))
    report("optimizer.pt: Adam's step, exp_avg and exp_avg_sq", same_layout and all(
        close(saved["state"][i][k].float(), theirs["state"][i][k].float()) for i in theirs["state"]
        for k in theirs["state"][i]))
    # Into a torch.optim optimizer: the hyperparameters are the user's.
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    saved["param_groups"] = [{**group, **g} for g in saved["param_groups"]]
    fresh = torch.optim.Adam(torch.jit.load(MLP[0]).parameters(), lr=1e-2, eps=1e-2)
    fresh.load_state_dict(saved)
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    report("manifest.json: format, step and world size", manifest["format"] == "spmd-checkpoint" and
           manifest["step"] == 3 and manifest["world_size"] == 1, manifest)
    report("manifest.json: the command that wrote it", manifest.get("command") ==
           ["spmd-run", artifact, "--device", "cpu", "--steps", "3", "--data", data, "--checkpoint", root],
           manifest.get("command"))
    return artifact, data, root


def resume_errors(artifacts, adam_artifact, adam_data, adam_root):
    other = pipeline("mlp_other.spmd", *MLP, ["--optimizer", "adam", "--lr", "2e-2", "--eps", "1e-2"])
    proc = run(other, "--steps", "5", "--data", adam_data, "--resume", adam_root, check=False)
    report("resume with another artifact: one-line error naming the flag that differs", proc.returncode == 1 and
           one_line_error(proc.stderr, "was written by another step (--lr 0.01 there, 0.02 here; fingerprint ") and
           "step " not in proc.stdout, proc.stderr)
    proc = run(adam_artifact, "--nproc", "2", "--steps", "5", "--resume", adam_root, check=False)
    report("resume with another world size: an error naming both", proc.returncode == 1 and
           "was written by a run of 1 ranks, this one has 2" in proc.stderr, proc.stderr)
    proc = run(other, "--steps", "1", "--data", adam_data, "--resume", adam_root, "--resume-weights-only",
               "--save-params", path("weights_only.pt"), check=False)
    report("--resume-weights-only starts at step 1 from its weights", proc.returncode == 0 and
           "step 1/1" in proc.stdout, proc.stderr)
    proc = run(adam_artifact, "--steps", "3", "--resume", adam_root, check=False)
    report("resume past --steps: an error", proc.returncode == 1 and "at step 3 already" in proc.stderr, proc.stderr)
    proc = run(adam_artifact, "--steps", "3", "--resume", path("no-such-dir"), check=False)
    report("resume from a missing folder", proc.returncode == 1 and one_line_error(proc.stderr, "no-such-dir"),
           proc.stderr)
    damaged = path("damaged.ckpt")
    subprocess.run(["cp", "-r", adam_root, damaged], check=True)
    folder = os.path.join(damaged, "step-00000003")
    with open(os.path.join(folder, "optimizer.pt"), "r+b") as f:
        f.truncate(100)
    proc = run(adam_artifact, "--steps", "5", "--resume", damaged, check=False)
    report("resume from a damaged checkpoint: names the file", proc.returncode == 1 and
           one_line_error(proc.stderr, "optimizer.pt"), proc.stderr)
    far = path("far.ckpt")
    subprocess.run(["cp", "-r", adam_root, far], check=True)
    manifest_path = os.path.join(far, "step-00000003", "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["step"] = 1000000000000  # once wrapped to a negative int and trained without end
    json.dump(manifest, open(manifest_path, "w"))
    proc = run(adam_artifact, "--steps", "5", "--resume", far, check=False)
    report("resume from a manifest whose step is out of range: refused", proc.returncode == 1 and
           one_line_error(proc.stderr, "manifest.json: /step: 1000000000000 is outside the steps a run can have"),
           proc.stderr)
    # Numbers of another type or range (issue 57): a step of 2.5 was read as 2, a seed of
    # -5 as 2^64 - 5, one of 2^70 accepted.
    for field, value, fragment in (("step", 2.5, "/step: must be an integer, not 2.5"),
                                   ("seed", -5, "/seed: must be an integer from 0 to 2^64 - 1"),
                                   ("seed", 2 ** 70, "/seed: must be an integer from 0 to 2^64 - 1")):
        edited = path(f"typed-{field}-{value}.ckpt")
        shutil.copytree(adam_root, edited)
        manifest_path = os.path.join(edited, "step-00000003", "manifest.json")
        manifest = json.load(open(manifest_path))
        manifest[field] = value
        json.dump(manifest, open(manifest_path, "w"))
        proc = run(adam_artifact, "--steps", "5", "--resume", edited, check=False)
        report(f"resume from a manifest whose {field} is {value}: refused", proc.returncode == 1 and
               one_line_error(proc.stderr, "manifest.json: " + fragment), proc.stderr)
    # A member of another step (issue 57): step 2's model.pt copied into step 3's folder,
    # each file whole and its CRCs valid, resumed with exit 0 and step 2's parameters.
    mixed = path("mixed.ckpt")
    run(adam_artifact, "--steps", "3", "--data", adam_data, "--checkpoint", mixed, "--checkpoint-every", "1",
        "--keep", "5")
    shutil.copy(os.path.join(mixed, "step-00000002", "model.pt"), os.path.join(mixed, "step-00000003", "model.pt"))
    proc = run(adam_artifact, "--steps", "5", "--data", adam_data, "--resume", mixed, check=False)
    report("resume from a step whose model.pt is another step's: refused", proc.returncode == 1 and one_line_error(
        proc.stderr, "step-00000003/model.pt: is not the file this step's manifest.json was written with"), proc.stderr)
    # An edited step (issue 44: 0, 3 or 5 resumed with other results): refused against the
    # folder's name, and, in a folder renamed by hand ("best"), against Adam's step counts.
    for edited, folder_name, fragment in ((2, "step-00000003", "/step: 2, but the folder is step-00000003"),
                                          (5, "best", "/step: 5, but optimizer.pt's Adam has taken 3 steps")):
        folder = os.path.join(path(f"edited-{edited}.ckpt"), folder_name)
        os.makedirs(os.path.dirname(folder))
        shutil.copytree(os.path.join(adam_root, "step-00000003"), folder)
        manifest_path = os.path.join(folder, "manifest.json")
        manifest = json.load(open(manifest_path))
        manifest["step"] = edited
        json.dump(manifest, open(manifest_path, "w"))
        proc = run(adam_artifact, "--steps", "8", "--resume", folder, check=False)
        report(f"resume from a manifest whose step was edited to {edited}: refused", proc.returncode == 1 and
               one_line_error(proc.stderr, fragment), proc.stderr)


def init_from_state_dict(adam_artifact, adam_data):
    """--init-from: PyTorch's own state_dict file gives the starting weights."""
    model = torch.jit.load(MLP[0])
    start = {k: v * 0.5 for k, v in model.state_dict().items()}
    torch.save(start, path("start.pt"))
    sgd = pipeline("mlp_sgd0.spmd", *MLP, ["--optimizer", "sgd", "--lr", "0"])
    proc = run(sgd, "--steps", "1", "--data", adam_data, "--init-from", path("start.pt"), "--save-params",
               path("init.pt"), check=False)
    report("--init-from: a state_dict's weights are the run's", proc.returncode == 0 and
           identical(load(path("init.pt")), start), proc.stderr)
    del start["mod.0.weight"]
    torch.save(start, path("partial.pt"))
    proc = run(sgd, "--steps", "1", "--init-from", path("partial.pt"), check=False)
    report("--init-from without a parameter: one-line error", proc.returncode == 1 and
           one_line_error(proc.stderr, "'mod.0.weight': the state dict has no value"), proc.stderr)


def whole_checkpoints(root):
    """Whether every step folder under root loads, and `latest` names one."""
    try:
        for f in folders(root):
            load(os.path.join(root, f, "model.pt"))
            load(os.path.join(root, f, "optimizer.pt"))
            load(os.path.join(root, f, "extra.pt"))
            json.load(open(os.path.join(root, f, "manifest.json")))
        latest = os.path.join(root, "latest")
        return not os.path.exists(latest) or open(latest).read().strip() in folders(root)
    except Exception as e:  # noqa: BLE001: any damage fails the case
        print("damaged:", root, e)
        return False


def crash_while_writing(artifacts):
    """SIGKILL at random moments of runs that checkpoint after every step:
    every folder left is whole, and resuming from the latest equals the
    uninterrupted run."""
    artifact, _ = artifacts["mlp unrolled, Adam, cosine"]
    data, _ = make_data("crash.data.pt", {"x": (8, 100)}, 5, 1)  # one rank: SIGKILL reaches the process that writes
    root, steps = path("crash.ckpt"), "60"
    run(artifact, "--steps", steps, "--data", data, "--save-params", path("crash_full.pt"))
    rng = random.Random(5)
    kills, whole = 0, True
    latest_file = os.path.join(root, "latest")
    read_latest = lambda: open(latest_file).read() if os.path.exists(latest_file) else ""
    for _ in range(5):
        resume = ["--resume", root] if os.path.exists(latest_file) else []
        before = read_latest()
        proc = subprocess.Popen([tool("spmd-run"), artifact, "--device", "cpu", "--steps", steps, "--data", data,
                                 "--checkpoint", root, "--checkpoint-every", "1", "--keep", "1000", *resume],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Once this run has written a checkpoint it writes one every step:
        # a kill a moment later lands in a step or in a write.
        deadline = time.time() + 120
        while read_latest() == before and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        finished = proc.poll() is not None
        if not finished:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        whole = whole and os.path.isdir(root) and whole_checkpoints(root)
        if finished:
            break
    report(f"SIGKILL while checkpointing after every step ({kills} kills): every folder left is whole",
           whole and kills > 0 and bool(folders(root)), folders(root) if os.path.isdir(root) else "no folder")
    full = load(path("crash_full.pt"))
    latest = open(os.path.join(root, "latest")).read().strip()
    if latest == "step-000000" + steps:
        final = load(os.path.join(root, latest, "model.pt"))
    else:
        run(artifact, "--steps", steps, "--data", data, "--resume", root, "--save-params", path("crash_resumed.pt"))
        final = load(path("crash_resumed.pt"))
    report("SIGKILL while checkpointing: resuming from the latest == uninterrupted",
           all(torch.equal(final[k], full[k]) for k in full))


def failed_write(artifacts):
    """A checkpoint that cannot be written (a file size limit, as a full disk
    would) is an error, and the previous checkpoint stays."""
    artifact, _ = artifacts["cnn plain, SGD momentum, step schedule"]
    data, _ = make_data("disk.data.pt", {"x": (8, 3, 16, 16), "y": (8, 4)}, 5, 1)
    root = path("full_disk.ckpt")
    run(artifact, "--steps", "2", "--data", data, "--checkpoint", root)

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    proc = run(artifact, "--steps", "4", "--data", data, "--checkpoint", root, "--resume", root, check=False,
               preexec_fn=small_files)
    report("a failed checkpoint write: one-line error", proc.returncode == 1 and
           one_line_error(proc.stderr, "cannot write") and "File too large" in proc.stderr, proc.stderr)
    metrics = path("full_disk.metrics.jsonl")
    proc = run(artifact, "--steps", "2", "--data", data, "--metrics", metrics, check=False, preexec_fn=lambda: (
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN), resource.setrlimit(resource.RLIMIT_FSIZE, (40, 40))))
    report("a --metrics log that cannot take its first line: one-line error, no file left",
           proc.returncode == 1 and one_line_error(proc.stderr, "--metrics") and "File too large" in proc.stderr and
           not os.path.exists(metrics), proc.stderr)
    report("a failed checkpoint write leaves the previous one", folders(root) == ["step-00000002"] and
           open(os.path.join(root, "latest")).read().strip() == "step-00000002" and
           not [f for f in os.listdir(root) if f.startswith(".tmp")], os.listdir(root))


# ---- data sources -----------------------------------------------------------------

def data_sources():
    artifact = pipeline("cnn_data.spmd", *CNN, ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"])
    _, tensors = make_data("cnn.pt", {"x": (8, 3, 16, 16), "y": (8, 4)}, 3, 2)
    base = ["--nproc", "2", "--steps", "5"]
    run(artifact, *base, "--data", path("cnn.pt"), "--save-params", path("dict.pt"))
    reference = load(path("dict.pt"))
    np.savez(path("cnn.npz"), **{k: v.numpy() for k, v in tensors.items()})
    run(artifact, *base, "--data", path("cnn.npz"), "--save-params", path("npz.pt"))
    report(".npz (numpy.savez) == the torch.save dict", identical(reference, load(path("npz.pt"))))
    os.makedirs(path("npy"), exist_ok=True)
    for k, v in tensors.items():
        np.save(os.path.join(path("npy"), k + ".npy"), v.numpy())
    run(artifact, *base, "--data", path("npy"), "--save-params", path("npy.pt"))
    report("a folder of .npy == the torch.save dict", identical(reference, load(path("npy.pt"))))
    os.makedirs(path("rows"), exist_ok=True)
    for k, v in tensors.items():  # [S, G, ...] as rows [S*G + 5, ...]: 5 left-over rows are never read
        rows = torch.cat([v.flatten(0, 1), torch.zeros(5, *v.shape[2:])])
        np.save(os.path.join(path("rows"), k + ".npy"), rows.numpy())
    run(artifact, *base, "--data", path("rows"), "--save-params", path("rows.pt"))
    report("rows [N, ...] == the torch.save dict's [S, G, ...]", identical(reference, load(path("rows.pt"))))
    np.savez_compressed(path("compressed.npz"), **{k: v.numpy() for k, v in tensors.items()})
    proc = run(artifact, "--steps", "1", "--data", path("compressed.npz"), check=False)
    report("a compressed .npz: one-line error", proc.returncode == 1 and
           one_line_error(proc.stderr, "numpy.savez_compressed"), proc.stderr)

    # Token streams: the windows spmd-run samples, written as a dict by the same generator.
    lm = pipeline("lm_tokens.spmd", "samples/lm.pt", ["tokens:i64[4,16]", "targets:i64[4,16]"],
                  ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-5"])
    stream = np.random.default_rng(1).integers(0, 64, 5000).astype(np.uint16)
    stream.tofile(path("train.bin"))
    seed, steps, ranks, rows, length = 7, 4, 2, 4, 16
    windows = {"tokens": torch.zeros(steps, rows * ranks, length, dtype=torch.int64),
               "targets": torch.zeros(steps, rows * ranks, length, dtype=torch.int64)}
    t = torch.from_numpy(stream.astype(np.int64))
    for s in range(steps):
        for r in range(ranks):
            g = torch.Generator().manual_seed(seed * 1000003 + r * 7919 + s)
            starts = torch.randint(len(stream) - length, (rows,), generator=g)
            for i, o in enumerate(starts.tolist()):
                windows["tokens"][s, r * rows + i] = t[o:o + length]
                windows["targets"][s, r * rows + i] = t[o + 1:o + length + 1]
    torch.save(windows, path("windows.pt"))
    common = ["--nproc", "2", "--steps", str(steps), "--seed", str(seed)]
    run(lm, *common, "--data", path("windows.pt"), "--save-params", path("windows_params.pt"))
    run(lm, *common, "--tokens", path("train.bin"), "--save-params", path("tokens_params.pt"))
    report("--tokens == the same windows as a dict", identical(load(path("windows_params.pt")),
                                                               load(path("tokens_params.pt"))))
    stream.astype(np.uint32).tofile(path("train32.bin"))
    run(lm, *common, "--tokens", path("train32.bin"), "--token-dtype", "uint32", "--save-params", path("t32.pt"))
    report("--token-dtype uint32 == uint16", identical(load(path("t32.pt")), load(path("tokens_params.pt"))))
    with open(path("odd.bin"), "wb") as f:
        f.write(b"\0" * 7)
    proc = run(lm, "--steps", "1", "--tokens", path("odd.bin"), check=False)
    report("a token file of odd length: one-line error", proc.returncode == 1 and
           one_line_error(proc.stderr, "not a whole number of uint16 tokens"), proc.stderr)


def main():
    artifacts = resume_cases()
    adam_artifact, adam_data, adam_root = pytorch_reads_checkpoint()
    resume_errors(artifacts, adam_artifact, adam_data, adam_root)
    init_from_state_dict(adam_artifact, adam_data)
    crash_while_writing(artifacts)
    failed_write(artifacts)
    data_sources()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
