"""Checkpoints under faults (issue 44): a kill at every rename, unlink, rmdir and
fsync of runs that replace and prune checkpoints leaves `latest` naming a whole
checkpoint, no step-* folder half written or half removed, and a folder a run
can resume from; a failing fsync is a one-line error that keeps the previous
checkpoint; an old checkpoint that cannot be removed (EIO) is a note and the
run goes on; two runs cannot write one folder; a resume says when the seed or
the data differ from the checkpoint's.

  check_checkpoint_crash.py BIN_DIR FAULT_INJECT_SO   (run from the repository root)

The faults come from tests/faults/fault_inject.cpp, loaded with LD_PRELOAD.
"""
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

BIN, INJECT = sys.argv[1], os.path.abspath(sys.argv[2])
TMP = tempfile.mkdtemp()
RUN = os.path.join(BIN, "spmd-run")
passed = failed = 0


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)[-2000:]), flush=True)


def lower_mlp():
    step = subprocess.run([os.path.join(BIN, "spmd-expand"), "samples/mlp.pt", "--input", "x:f32[8,100]",
                           "--optimizer", "adam", "--lr", "0.01"], capture_output=True, check=True).stdout
    artifact = os.path.join(TMP, "mlp.spmd")
    subprocess.run([os.path.join(BIN, "spmd-lower"), "-", "-o", artifact], input=step, capture_output=True, check=True)
    return artifact


def run(artifact, *flags, env=None):
    return subprocess.run([RUN, artifact, "--device", "cpu", *flags], capture_output=True, text=True, timeout=300,
                          env=env)


def problems_of(root):
    """What is wrong with the checkpoints under root ([] when nothing is)."""
    found = []
    steps = sorted(f for f in os.listdir(root) if f.startswith("step-"))
    for f in steps:
        try:
            for member in ("model.pt", "optimizer.pt", "extra.pt"):
                torch.load(os.path.join(root, f, member))
            json.load(open(os.path.join(root, f, "manifest.json")))
        except Exception as e:  # noqa: BLE001: any damage is a problem
            found.append(f"{f} is not whole: {e}")
    latest = os.path.join(root, "latest")
    if not os.path.exists(latest):
        found.append("no latest")
    elif open(latest).read().strip() not in steps:
        found.append(f"latest names {open(latest).read().strip()!r}, not one of {steps}")
    return found


def kill_at_every_call(artifact, base):
    """Replacing step-1..3 and pruning to 2, killed before each call in turn."""
    bad, kills, resumed = [], 0, 0
    for n in range(1, 500):
        work = os.path.join(TMP, "work")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        env = dict(os.environ, LD_PRELOAD=INJECT, SPMD_FAULT_KILL_AT=str(n))
        proc = run(artifact, "--steps", "3", "--checkpoint", work, "--checkpoint-every", "1", "--keep", "2", env=env)
        if proc.returncode == 0:
            break  # n is past the run's last call
        kills += 1
        found = problems_of(work)
        if not found:
            again = run(artifact, "--steps", "4", "--resume", work, "--checkpoint", work)
            resumed += again.returncode == 0
            if again.returncode != 0:
                found.append("resume failed: " + again.stderr.strip())
        if found:
            bad.append(f"killed at call {n}: " + "; ".join(found))
    report(f"killed at each of {kills} calls while replacing and pruning: latest whole, no step folder damaged, "
           f"the run resumes ({resumed} resumed)", kills >= 10 and not bad and resumed == kills, bad[:5])


def failing_fsync(artifact, base):
    for what, extra in (("a file's", {}), ("a folder's", {"SPMD_FAULT_FSYNC_FOLDERS": "1"})):
        work = os.path.join(TMP, "fsync")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        env = dict(os.environ, LD_PRELOAD=INJECT, SPMD_FAULT_FSYNC_ERRNO="5", **extra)
        proc = run(artifact, "--steps", "4", "--resume", work, "--checkpoint", work, env=env)
        lines = proc.stderr.strip().split("\n")
        report(f"{what} failing fsync is a one-line error", proc.returncode == 1 and len(lines) == 1 and
               lines[0].startswith("spmd-run: error: ") and "Input/output error" in lines[0], proc.stderr)
        report(f"{what} failing fsync leaves latest on a whole checkpoint", not problems_of(work), problems_of(work))


def failing_prune(artifact, base):
    """EIO while pruning: the new checkpoint is whole, so the run says which old
    folder stays and trains on (exit 0); the next checkpoint prunes it."""
    cases = (("renaming an old folder away", "rename", "step-00000001", "step-00000001 (Input/output error); it stays"),
             ("removing a renamed folder's files", "unlink", "pruned-", "renamed to "))
    for what, call, part, note in cases:
        work = os.path.join(TMP, "prune")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        env = dict(os.environ, LD_PRELOAD=INJECT, SPMD_FAULT_CALL=call, SPMD_FAULT_PATH=part, SPMD_FAULT_ERRNO="5")
        proc = run(artifact, "--steps", "4", "--resume", work, "--checkpoint", work, "--keep", "2", env=env)
        notes = [l for l in proc.stderr.splitlines() if l.startswith("spmd-run: note: --checkpoint: ")]
        others = [l for l in proc.stderr.splitlines() if l not in notes]
        report(f"EIO {what} while pruning is a note and the run ends with exit 0",
               proc.returncode == 0 and len(notes) >= 1 and all(note in n for n in notes) and not others and
               open(os.path.join(work, "latest")).read().strip() == "step-00000004" and not problems_of(work),
               proc.stderr)
        proc = run(artifact, "--steps", "5", "--resume", work, "--checkpoint", work, "--keep", "2")
        left = sorted(f for f in os.listdir(work) if f.startswith(("step-", ".tmp-")))
        report(f"after EIO {what}, the next run prunes to --keep", proc.returncode == 0 and
               left == ["step-00000004", "step-00000005"], (proc.stderr, left))


def two_writers(artifact, base):
    work = os.path.join(TMP, "shared")
    shutil.copytree(base, work)
    with open(os.path.join(work, ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a run writing there holds it
        proc = run(artifact, "--steps", "4", "--resume", work, "--checkpoint", work)
    report("a second run writing one checkpoint folder is refused", proc.returncode == 1 and
           "another run is writing checkpoints here" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr)
    proc = run(artifact, "--steps", "4", "--resume", work, "--checkpoint", work)
    report("once the first run is gone, the folder takes a run", proc.returncode == 0 and not problems_of(work) and
           open(os.path.join(work, "latest")).read().strip() == "step-00000004", proc.stderr)


def resume_notes(artifact, base):
    """A resume continues the checkpoint's seed and data position: another --seed or
    other data is said, once, as a note."""
    work = os.path.join(TMP, "notes")
    shutil.copytree(base, work)
    manifest = json.load(open(os.path.join(work, "step-00000003", "manifest.json")))
    data = os.path.join(TMP, "other.pt")
    torch.save({"x": torch.randn(5, 8, 100)}, data)
    cases = (("the same seed and data", [], None),
             ("another --seed", ["--seed", "7"], r"continues the checkpoint's seed 0, not --seed 7"),
             ("other data", ["--data", data], "written training on random inputs; this run trains on --data other.pt ("))
    for name, flags, note in cases:
        proc = run(artifact, "--steps", "4", "--resume", os.path.join(work, "step-00000003"), *flags)
        notes = [l for l in proc.stderr.splitlines() if l.startswith("spmd-run: note: ")]
        want = [] if note is None else [note]
        ok = proc.returncode == 0 and len(notes) == len(want) and all(w in n for w, n in zip(want, notes))
        report(f"resume with {name}: " + ("no note" if note is None else "a note"), ok, proc.stderr)
    report("the manifest records the data", manifest.get("data") == "random inputs", manifest)


def main():
    artifact = lower_mlp()
    base = os.path.join(TMP, "base")
    proc = run(artifact, "--steps", "3", "--checkpoint", base, "--checkpoint-every", "1")
    if proc.returncode != 0 or problems_of(base):
        print("FAIL the starting checkpoints:", proc.stderr, problems_of(base))
        return 1
    kill_at_every_call(artifact, base)
    failing_fsync(artifact, base)
    failing_prune(artifact, base)
    two_writers(artifact, base)
    resume_notes(artifact, base)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
