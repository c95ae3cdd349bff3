"""spmd-train, the one-command driver: a model given as a Python function and a
TOML file train on 2 CPU ranks to the same parameters, bit for bit, as
spmd-compile and spmd-run given the same flags; the command line overrides the
file; the resolved configuration is written and is itself a config that runs
the same; checkpoints resume bit for bit; bad files and models exit 1 in one
line naming the file and place.

  check_train.py BIN_DIR        (python3 with torch; any working directory)
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import torch

BIN = os.path.abspath(sys.argv[1])
TMP = tempfile.mkdtemp()
passed = failed = 0

MODEL = '''
import torch, torch.nn as nn, torch.nn.functional as F

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.bn = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.0)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(self.drop(self.bn(self.norm(F.relu(self.fc1(x)))))), y)

def make():
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 16), torch.randint(0, 4, (8,)))

def broken():
    raise ValueError("no such layer")
'''

CONFIG = '''
[model]
module = "model.py"

[compile]
optimizer = "adamw"
lr = 1e-2
lr-schedule = "cosine"
warmup-steps = 2
decay-steps = 10
clip-grad-norm = 1.0
bucket-cap-mb = 0.001

[run]
nproc = 2
steps = 6
seed = 3
save-params = "params.pt"
save-state-dict = "state.pt"
'''


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


def run(args, cwd=TMP):
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=300)


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def params(path):
    return torch.load(os.path.join(TMP, path))


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def train(*args):
    return run([os.path.join(BIN, "spmd-train"), *args])


def driver_matches_the_tools():
    write("model.py", MODEL)
    write("train.toml", CONFIG)
    proc = train("train.toml")
    report("spmd-train trains from model.py and train.toml", proc.returncode == 0 and "step 6/6" in proc.stdout,
           proc.stderr[-600:])
    if proc.returncode != 0:
        return
    files = sorted(os.listdir(os.path.join(TMP, "train.run")))
    report("the run folder holds model.pt2, step.spmd, config.toml", files == ["config.toml", "model.pt2", "step.spmd"],
           str(files))
    # The same through the tools, from the model the driver exported.
    compile_ = run([os.path.join(BIN, "spmd-compile"), "train.run/model.pt2", "--optimizer", "adamw", "--lr", "1e-2",
                    "--lr-schedule", "cosine", "--warmup-steps", "2", "--decay-steps", "10", "--clip-grad-norm", "1.0",
                    "--bucket-cap-mb", "0.001", "--device", "cpu", "-o", "tools.spmd"])
    same_artifact = compile_.returncode == 0 and open(os.path.join(TMP, "tools.spmd"), "rb").read() == open(
        os.path.join(TMP, "train.run/step.spmd"), "rb").read()
    report("its artifact is spmd-compile's from the same flags", same_artifact, compile_.stderr[-400:])
    tools = run([os.path.join(BIN, "spmd-run"), "tools.spmd", "--nproc", "2", "--steps", "6", "--seed", "3",
                 "--save-params", "tools-params.pt"])
    report("its parameters are spmd-run's, bit for bit", tools.returncode == 0 and
           same(params("params.pt"), params("tools-params.pt")), tools.stderr[-400:])

    # --save-state-dict: what model.load_state_dict(strict=True) takes, buffers included.
    sys.path.insert(0, TMP)
    import model as user_model
    net, _ = user_model.make()
    state = torch.load(os.path.join(TMP, "state.pt"))
    try:
        net.load_state_dict(state, strict=True)
        loaded = ""
    except RuntimeError as e:
        loaded = str(e)
    trained = params("params.pt")
    ok = (not loaded and all(torch.equal(net.state_dict()[k], trained[k]) for k in trained) and
          int(net.bn.num_batches_tracked) == 6 and not torch.equal(net.bn.running_mean, torch.zeros(32)))
    report("--save-state-dict loads with load_state_dict(strict=True), buffers trained", ok,
           loaded or str(list(state)))

    # The resolved configuration: valid TOML, every value the run used, itself a config.
    resolved = tomllib.load(open(os.path.join(TMP, "train.run/config.toml"), "rb"))
    ok = (resolved["compile"]["lr"] == 0.01 and resolved["compile"]["lr-schedule"] == "cosine" and
          resolved["run"]["steps"] == 6 and resolved["run"]["nproc"] == 2 and resolved["model"]["function"] == "make")
    report("config.toml holds the resolved configuration", ok, str(resolved))
    again = train("train.run/config.toml", "--dir", "again", "--save-params", "again.pt")
    report("config.toml trains the same run", again.returncode == 0 and same(params("params.pt"), params("again.pt")),
           again.stderr[-400:])


def evaluation():
    """--eval-every with held-out data: the validation loss after steps 3 and 6 is eager PyTorch's
    model.eval() loss with the trained weights (rank 0's buffers, as DDP broadcasts them), averaged
    over the batches and the ranks; dropout (p 0.5 here) is off in it."""
    write("drop.py", MODEL.replace("nn.Dropout(0.0)", "nn.Dropout(0.5)"))
    g = torch.Generator().manual_seed(5)
    torch.save({"x": torch.randn(6, 16, 16, generator=g), "y": torch.randint(0, 4, (6, 16), generator=g)},
               os.path.join(TMP, "train_data.pt"))
    val = {"x": torch.randn(2, 16, 16, generator=g), "y": torch.randint(0, 4, (2, 16), generator=g)}
    torch.save(val, os.path.join(TMP, "val_data.pt"))
    write("eval.toml", CONFIG.replace('module = "model.py"', 'module = "drop.py"') +
          'data = "train_data.pt"\neval-data = "val_data.pt"\neval-every = 3\neval-steps = 2\n')
    proc = train("eval.toml", "--json", "--save-state-dict", "eval_state.pt")
    result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    steps = [s for s, _ in result.get("val_losses", [])]
    report("--eval-every 3 over 6 steps evaluates after steps 3 and 6", steps == [3, 6],
           proc.stderr[-500:] + str(result)[:300])
    if steps != [3, 6]:
        return
    sys.path.insert(0, TMP)
    import drop as user_model
    net, _ = user_model.make()
    net.load_state_dict(torch.load(os.path.join(TMP, "eval_state.pt")))
    net.eval()
    with torch.no_grad():
        # Each rank's 8 rows of each batch, its mean over the batches, then the ranks' mean.
        per_rank = [sum(float(net(val["x"][k, r * 8:(r + 1) * 8], val["y"][k, r * 8:(r + 1) * 8])) for k in range(2)) / 2
                    for r in range(2)]
    expected = sum(per_rank) / 2
    got = result["val_losses"][-1][1]
    report("the validation loss is eager model.eval()'s", abs(got - expected) <= 1e-6 * abs(expected),
           f"{got} against {expected}")
    files = sorted(os.listdir(os.path.join(TMP, "eval.run")))
    report("the run folder holds eval.spmd", "eval.spmd" in files, str(files))
    metrics = train("eval.toml", "--steps", "3", "--dir", "eval2", "--metrics", "m.jsonl")
    lines = [json.loads(line) for line in open(os.path.join(TMP, "m.jsonl"))] if metrics.returncode == 0 else []
    ok = "val loss" in metrics.stdout and [line.get("val_loss") is not None for line in lines] == [False, False, True]
    report("the progress line and --metrics show the validation loss", ok, metrics.stdout[-300:] + metrics.stderr[-300:])


def eval_refusals():
    """spmd-run --eval's own checks, before step 1, in one line."""
    run_ = os.path.join(BIN, "spmd-run")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    mlp = run([os.path.join(BIN, "spmd-compile"), os.path.join(root, "samples", "mlp.pt2"), "--eval-step", "-o",
               "mlp-eval.spmd"])
    shell = subprocess.run(f"{BIN}/spmd-expand eval.run/model.pt2 --eval-step | {BIN}/spmd-lower -o piped-eval.spmd",
                           shell=True, capture_output=True, text=True, cwd=TMP)
    report("spmd-expand --eval-step | spmd-lower is spmd-compile --eval-step",
           shell.returncode == 0 and open(os.path.join(TMP, "piped-eval.spmd"), "rb").read() == open(
               os.path.join(TMP, "eval.run/eval.spmd"), "rb").read(), shell.stderr[-300:])
    cases = [
        ("--eval-every without --eval", ["eval.run/step.spmd", "--eval-every", "2"],
         r"spmd-run: error: --eval-every: needs --eval FILE"),
        ("--eval without held-out data", ["eval.run/step.spmd", "--eval", "eval.run/eval.spmd"],
         r"spmd-run: error: --eval: needs held-out data"),
        ("a training step as --eval", ["eval.run/step.spmd", "--eval", "eval.run/step.spmd", "--eval-data", "val_data.pt"],
         r"spmd-run: error: .*--eval eval\.run/step\.spmd: not an evaluation step"),
        ("another model's evaluation step", ["eval.run/step.spmd", "--eval", "mlp-eval.spmd", "--eval-data",
                                             "val_data.pt"],
         r"spmd-run: error: .*--eval mlp-eval\.spmd: its parameter '.*' is not one of the training step's"),
    ]
    for name, args, pattern in cases:
        proc = run([run_, *args, "--steps", "1"])
        lines = proc.stderr.strip().splitlines()
        ok = mlp.returncode == 0 and proc.returncode == 1 and len(lines) == 1 and re.match(pattern, lines[0])
        report(f"spmd-run refuses {name}", bool(ok), f"exit {proc.returncode}, {proc.stderr.strip()[-300:]!r}")


def shuffled_epochs():
    """--shuffle: each epoch's rows in the order of torch.randperm seeded by the seed and the epoch, the
    same on every rank; the same run as the unshuffled one on the file Python shuffled so; resumable."""
    g = torch.Generator().manual_seed(11)
    rows = {"x": torch.randn(48, 16, generator=g), "y": torch.randint(0, 4, (48,), generator=g)}
    torch.save(rows, os.path.join(TMP, "rows.pt"))
    seed, global_rows, steps = 7, 16, 7          # 3 batches an epoch: 7 steps reach the third epoch
    order = []
    for epoch in range(3):
        gen = torch.Generator().manual_seed((seed * 1000003 + 0x5DEECE66D + epoch) % 2**64)
        order.append(torch.randperm(48, generator=gen))
    order = torch.cat(order)
    torch.save({k: v[order].reshape(9, global_rows, *v.shape[1:]) for k, v in rows.items()},
               os.path.join(TMP, "ordered.pt"))
    base = [os.path.join(BIN, "spmd-run"), "train.run/step.spmd", "--nproc", "2", "--seed", str(seed)]
    shuffled = run(base + ["--steps", str(steps), "--data", "rows.pt", "--shuffle", "--save-params", "shuffled.pt"])
    ordered = run(base + ["--steps", str(steps), "--data", "ordered.pt", "--save-params", "ordered.pt"])
    report("--shuffle reads epochs in torch.randperm's seeded order",
           shuffled.returncode == 0 and ordered.returncode == 0 and same(params("shuffled.pt"), params("ordered.pt")),
           (shuffled.stderr + ordered.stderr)[-400:])
    first = run(base + ["--steps", "4", "--data", "rows.pt", "--shuffle", "--checkpoint", "shuffle-ck"])
    resumed = run(base + ["--steps", str(steps), "--data", "rows.pt", "--shuffle", "--resume", "shuffle-ck",
                          "--save-params", "shuffle-resumed.pt"])
    report("a shuffled run resumed mid-epoch continues the same order",
           first.returncode == 0 and resumed.returncode == 0 and same(params("shuffled.pt"), params("shuffle-resumed.pt")),
           (first.stderr + resumed.stderr)[-400:])
    # A flag of the file met by one on the command line: --checkpoint-every (line) needs checkpoint (file).
    write("ck.toml", CONFIG + 'checkpoint = "ck-from-file"\n')
    proc = train("ck.toml", "--dir", "ckrun", "--checkpoint-every", "3", "--steps", "3")
    report("--checkpoint-every on the command line takes checkpoint from the file",
           proc.returncode == 0 and os.path.isdir(os.path.join(TMP, "ck-from-file", "step-00000003")),
           proc.stderr[-300:])
    proc = train("train.toml", "--dir", "ckrun", "--checkpoint-every", "3", "--steps", "3")
    report("--checkpoint-every with no checkpoint anywhere is refused in one line",
           proc.returncode == 1 and proc.stderr.strip() == "spmd-train: error: --checkpoint-every: needs --checkpoint",
           proc.stderr[-300:])


def command_line_wins():
    proc = train("train.toml", "--steps", "3", "--lr", "0.05", "--dir", "override", "--print-config")
    resolved = tomllib.loads(proc.stdout) if proc.returncode == 0 else {}
    ok = resolved.get("run", {}).get("steps") == 3 and resolved.get("compile", {}).get("lr") == 0.05
    report("the command line overrides the file (--print-config)", ok, proc.stdout[-300:] + proc.stderr[-300:])
    proc = train("train.toml", "--steps", "3", "--nproc", "1", "--dir", "override", "--save-params", "three.pt")
    report("--steps 3 on the command line runs 3 steps on 1 rank",
           proc.returncode == 0 and "3 steps on 1 rank" in proc.stdout + proc.stderr, proc.stdout[-300:])


def checkpoints_resume():
    straight = train("train.toml", "--dir", "ck", "--steps", "8", "--save-params", "straight.pt")
    first = train("train.toml", "--dir", "ck", "--steps", "4", "--checkpoint", "ckpt", "--checkpoint-every", "2")
    resumed = train("train.toml", "--dir", "ck", "--steps", "8", "--resume", "ckpt", "--save-params", "resumed.pt")
    ok = all(p.returncode == 0 for p in (straight, first, resumed)) and same(params("straight.pt"), params("resumed.pt"))
    report("a run resumed from its checkpoint ends where the straight run does", ok,
           (first.stderr + resumed.stderr)[-400:])
    kept = os.path.join(TMP, "ckpt", "step-00000004", "config.toml")
    report("each checkpoint keeps the resolved configuration",
           os.path.exists(kept) and tomllib.load(open(kept, "rb"))["compile"]["lr"] == 0.01)
    other = train("train.toml", "--dir", "ck", "--steps", "8", "--resume", "ckpt", "--lr", "0.05")
    report("a resume with another [compile] value is refused in one line naming it",
           other.returncode == 1 and other.stderr.count("\n") == 1 and
           "was compiled with lr = 0.01" in other.stderr and "this run has 0.05" in other.stderr, other.stderr[-400:])


def refusals():
    write("typo.toml", CONFIG.replace("lr = 1e-2", "lr = 1e-2\nlearning-rate = 3"))
    write("table.toml", CONFIG + "\n[optimizer]\nbeta = 1\n")
    write("syntax.toml", CONFIG.replace('optimizer = "adamw"', "optimizer = adamw"))
    write("value.toml", CONFIG.replace("lr = 1e-2", 'lr = "fast"'))
    write("array.toml", CONFIG.replace("steps = 6", "steps = [6, 7]"))
    write("nofunc.toml", CONFIG.replace('module = "model.py"', 'module = "model.py"\nfunction = "nothing"'))
    write("raises.toml", CONFIG.replace('module = "model.py"', 'module = "model.py"\nfunction = "broken"'))
    write("nomodel.toml", CONFIG.replace('module = "model.py"', ""))
    line = 1 + CONFIG.split("\n").index("lr = 1e-2") + 1
    cases = [
        ("an unknown key", ["typo.toml"], rf"spmd-train: error: typo\.toml:{line}:1: learning-rate: \[compile\] has no "
                                          r"such key"),
        ("an unknown table", ["table.toml"], r"spmd-train: error: table\.toml:\d+:1: \[optimizer\]: no such table"),
        ("a file that is not TOML", ["syntax.toml"], r"spmd-train: error: syntax\.toml:\d+:\d+: "),
        ("a value the flag refuses", ["value.toml"], r"spmd-train: error: value\.toml:\d+:1: lr: "),
        ("an array for a one-value flag", ["array.toml"], r"spmd-train: error: array\.toml:\d+:1: steps: takes one value"),
        ("a missing function", ["nofunc.toml"], r"spmd-train: error: nofunc\.toml: \[model\]: exporting model\.py's nothing\(\): model\.py: no function "
                                                r"'nothing'"),
        ("a model function that raises", ["raises.toml"],
         r"spmd-train: error: raises\.toml: \[model\]: .*model\.py:\d+: ValueError: no such layer"),
        ("no model", ["nomodel.toml"], r"spmd-train: error: nomodel\.toml: \[model\]: no model"),
        ("a missing config", ["none.toml"], r"spmd-train: error: none\.toml: "),
    ]
    for name, args, pattern in cases:
        proc = train(*args, "--dir", "refused")
        lines = proc.stderr.strip().splitlines()
        ok = proc.returncode == 1 and len(lines) == 1 and re.match(pattern, lines[0]) is not None
        report(f"refused in one line: {name}", ok, f"exit {proc.returncode}, {proc.stderr.strip()[-400:]!r}")
    left = [f for f in os.listdir(os.path.join(TMP, "refused"))] if os.path.isdir(os.path.join(TMP, "refused")) else []
    report("a refused run leaves no step.spmd", "step.spmd" not in left, str(left))


driver_matches_the_tools()
evaluation()
eval_refusals()
shuffled_epochs()
command_line_wins()
checkpoints_resume()
refusals()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
