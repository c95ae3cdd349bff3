"""spmd_export's errors name their cause, as an exception from the API and as
one line with exit 1 from `python3 -m spmd_export`; and its expansion of
torch.optim's foreach ops computes exactly what the foreach ops compute.

  check_errors.py        (python/ on PYTHONPATH, a python3 with torch)
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch

import spmd_export
from spmd_export import _export
from spmd_export._foreach import expand_foreach

passed = failed = 0
tmp = tempfile.mkdtemp()
# `python3 -m spmd_export` in the CLI checks, run from other folders too,
# finds the package this script imported.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(spmd_export.__file__)))]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


def expect_error(name, fragment, step, model, optimizer, batch):
    try:
        spmd_export.export(step, model, optimizer, batch, os.path.join(tmp, name + ".json"))
    except spmd_export.SpmdExportError as e:
        report(name, fragment in str(e), f"message {str(e)!r} lacks {fragment!r}")
        return
    except Exception as e:  # anything else is a crash, not a diagnosis
        report(name, False, f"raised {type(e).__name__}: {e}")
        return
    report(name, False, "exported without an error")


class HeavyBall(torch.optim.Optimizer):
    """A user's own optimizer: velocity = 0.5 * velocity + grad; p -= lr * velocity."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p)
                state["velocity"].mul_(0.5).add_(p.grad)
                p.sub_(state["velocity"], alpha=group["lr"])


def plain_step(model, optimizer, x):
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def branching_step(model, optimizer, x):
    loss = model(x).sum()
    if loss > 0:  # data-dependent Python control flow
        loss = loss * 2
    loss.backward()
    optimizer.step()
    return loss


def silent_step(model, optimizer, x):
    plain_step(model, optimizer, x)


class Refusing(torch.nn.Module):
    """A model whose forward raises (the user's own error)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        raise ValueError("refusing input of shape " + str(tuple(x.shape)))


def expect_cli(name, fragment, args, code=1):
    """`python3 -m spmd_export ARGS` fails with `code` and exactly one line,
    'spmd_export: error: ...' containing `fragment`."""
    proc = subprocess.run([sys.executable, "-m", "spmd_export"] + args, capture_output=True, text=True)
    lines = proc.stderr.splitlines()
    report("CLI: " + name, proc.returncode == code and len(lines) == 1 and lines[0].startswith("spmd_export: error: ")
           and fragment in lines[0], f"exit {proc.returncode}, stderr {proc.stderr!r} (wanted {fragment!r})")


def small_mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def tied_mlp():
    """Two layers sharing one weight, as an LM's head shares its token embedding's."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    model[2].weight = model[0].weight
    return model


def check_foreach_expansion(name, make_opt, make_model=small_mlp):
    """The traced foreach step, run by torch before and after its foreach ops
    are expanded into per-tensor ops, gives bit-identical results."""
    torch.manual_seed(0)
    model = make_model()
    gm, inputs, _, tensors = _export._trace(plain_step, model, make_opt(model.parameters()), torch.randn(5, 4))
    expanded = expand_foreach(copy.deepcopy(gm), spmd_export.SpmdExportError)
    targets = lambda g: [str(n.target) for n in g.graph.nodes if n.op == "call_function"]
    had = sum("_foreach_" in t for t in targets(gm))
    left = [t for t in targets(expanded) if "_foreach_" in t]

    def run(graph):
        # Grouped as the traced step takes them; the step updates them in place.
        groups = {k: [] for k in ("parameter", "buffer", "state", "data")}
        for n, kind, _ in inputs:
            groups[kind].append(tensors[n].clone() if kind != "data" else torch.ones(5, 4))
        with torch.no_grad():
            out = graph(*groups.values())
        return list(out) + [t for ts in groups.values() for t in ts]

    same = all(torch.equal(a, b) for a, b in zip(run(gm), run(expanded)))
    report(f"foreach expansion is exact: {name}", had > 0 and not left and same,
           f"{had} foreach ops traced, left {left}, results equal: {same}")


def check_tied_weights():
    """A weight two modules share is one parameter input, and the traced
    step's gradient of it is eager autograd's (both uses summed); the trace
    leaves no gradient on the user's model."""
    torch.manual_seed(0)
    model, x = tied_mlp(), torch.randn(5, 4)
    for name, make_opt in [("SGD momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
                           ("AdamW foreach", lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=True)),
                           ("AdamW", lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=False))]:
        what = f"tied weights are one parameter: {name}"
        try:
            gm, inputs, grad_params, tensors = _export._trace(plain_step, model, make_opt(model.parameters()), x)
            spmd_export.export(plain_step, model, make_opt(model.parameters()), x, os.path.join(tmp, "tied.json"))
        except Exception as e:
            report(what, False, f"{type(e).__name__}: {e}")
            continue
        params = [n for n, kind, _ in inputs if kind == "parameter"]
        states = [tensors[n].clone() for n, kind, _ in inputs if kind == "state"]
        with torch.no_grad():
            traced = gm([tensors[n].clone() for n in params], [], states, [x])[1:]
        eager = torch.autograd.grad(model(x).sum(), list(model.parameters()))
        same = len(traced) == len(eager) and all(torch.allclose(a, b) for a, b in zip(traced, eager))
        report(what, params == grad_params == ["0.weight", "0.bias", "2.bias"] and same and
               all(p.grad is None for p in model.parameters()), f"parameters {params}, gradients equal: {same}")


class Scaled(torch.nn.Linear):
    """A Linear whose output is scaled by a plain tensor attribute, not a buffer."""

    def __init__(self):
        super().__init__(4, 3)
        self.scale = torch.ones(3)

    def forward(self, x):
        return super().forward(x) * self.scale


class StaleView(torch.nn.Linear):
    """Reads a view of a tensor taken before an in-place write to the tensor
    (it would see the write)."""

    def forward(self, x):
        y = super().forward(x)
        transposed = y.t()
        y.mul_(2)
        return transposed.sum()


def check_outside_tensors(x):
    """Tensors the step reads that are no input (make_fx records them as
    constants) are named, not frozen into the dump."""
    model = torch.nn.Linear(4, 3)
    other = torch.nn.Linear(3, 3)

    def step_with_other(model, optimizer, x):
        return plain_step(lambda t: other(model(t)), optimizer, x)

    expect_error("a parameter outside the model", "not one of the model's parameters", step_with_other, model,
                 torch.optim.SGD(model.parameters(), lr=0.1), x)
    stale = StaleView(4, 3)
    expect_error("a view read after a write to its base", "a view of addmm taken before the write",
                 plain_step, stale, torch.optim.SGD(stale.parameters(), lr=0.1), x)
    scaled = Scaled()
    expect_error("a tensor attribute that is not a buffer", "register it as a buffer", plain_step, scaled,
                 torch.optim.SGD(scaled.parameters(), lr=0.1), x)


def main():
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    expect_error("data-dependent control flow", "reads tensor values in Python", branching_step, model,
                 torch.optim.SGD(model.parameters(), lr=0.1), x)
    expect_error("SGD dampening", "dampening", plain_step, model,
                 torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5), x)
    expect_error("optimizer without state", "RMSprop has no state yet", plain_step, model,
                 torch.optim.RMSprop(model.parameters()), x)
    expect_error("no loss returned", "must return the loss", silent_step, model,
                 torch.optim.SGD(model.parameters(), lr=0.1), x)
    expect_error("not a module", "model must be a torch.nn.Module", plain_step, object(),
                 torch.optim.SGD(model.parameters(), lr=0.1), x)
    expect_error("foreign parameter", "not the model's", plain_step, torch.nn.Linear(4, 3),
                 torch.optim.SGD(model.parameters(), lr=0.1), x)

    # RMSprop, stepped once, keeps its step count as a tensor: the step exports.
    rms = torch.optim.RMSprop(model.parameters())
    plain_step(model, rms, x)
    try:
        doc = spmd_export.export(plain_step, model, rms, x, os.path.join(tmp, "rms.json"))
        report("RMSprop with a tensor step count exports", any(i["kind"] == "state" for i in doc["inputs"]),
               str([i["name"] for i in doc["inputs"]]))
    except Exception as e:
        report("RMSprop with a tensor step count exports", False, f"{type(e).__name__}: {e}")
    # A Python number in the state would be frozen by the trace.
    frozen = torch.optim.SGD(model.parameters(), lr=0.1)
    frozen.state[model.weight]["count"] = 3
    expect_error("Python number in optimizer state", "state 'count' of weight is a Python int", plain_step, model,
                 frozen, x)

    # An optimizer of the user's own, stepped once, exports the state it made.
    heavy = HeavyBall(model.parameters(), lr=0.1)
    plain_step(model, heavy, x)
    try:
        doc = spmd_export.export(plain_step, model, heavy, x, os.path.join(tmp, "heavy.json"))
        kinds = {i["name"]: i["kind"] for i in doc["inputs"]}
        report("a custom optimizer's state is exported", kinds.get("weight.velocity") == "state" and
               {u["input"] for u in doc["updates"]} >= {"weight", "weight.velocity"}, str(kinds))
    except Exception as e:
        report("a custom optimizer's state is exported", False, f"{type(e).__name__}: {e}")

    refusing = Refusing()
    expect_error("forward raises", "the train step raised ValueError: refusing input of shape (2, 4) (at "
                 + os.path.abspath(__file__), plain_step, refusing, torch.optim.SGD(refusing.parameters(), lr=0.1), x)
    expect_error("forward fails inside torch", "the train step raised RuntimeError: mat1 and mat2 shapes", plain_step,
                 model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(2, 5))
    # Adagrad's step reads its step count with .item(): the optimizer is named as the cause.
    expect_error("unsupported optimizer", "Adagrad.step() reads tensor values in Python", plain_step, model,
                 torch.optim.Adagrad(model.parameters()), x)
    # fused=True where PyTorch has no fused kernel (the meta device): the cause,
    # before any tracing. (A group switched to fused after construction, which
    # would have refused it.)
    meta = torch.nn.Linear(4, 3, device="meta")
    fused = torch.optim.Adam(meta.parameters())
    fused.param_groups[0]["fused"] = True
    expect_error("fused=True without a fused kernel", "Adam(fused=True) needs its parameters on", plain_step, meta,
                 fused, x)
    check_tied_weights()
    check_outside_tensors(x)

    for name, make_opt in [
            ("SGD", lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True)),
            ("SGD nesterov, weight decay, maximize", lambda ps: torch.optim.SGD(
                ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1, maximize=True, foreach=True)),
            ("Adam amsgrad, weight decay, maximize", lambda ps: torch.optim.Adam(
                ps, lr=0.1, amsgrad=True, weight_decay=0.1, maximize=True, foreach=True)),
            ("AdamW amsgrad", lambda ps: torch.optim.AdamW(ps, lr=0.1, amsgrad=True, foreach=True))]:
        check_foreach_expansion(name, make_opt)
    check_foreach_expansion("AdamW weight decay, tied weights",
                            lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1, foreach=True), tied_mlp)

    # The command line: one line on stderr, exit 1; a good target writes both files.
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "spmd_export", "no_such_module:make"], capture_output=True,
                          text=True, env=env)
    report("CLI: unknown module", proc.returncode == 1 and proc.stderr.count("\n") == 1 and
           proc.stderr.startswith("spmd_export: error: cannot import no_such_module"), proc.stderr)
    target = os.path.join(tmp, "target.py")
    with open(target, "w") as f:
        f.write("import torch\n"
                "def make():\n"
                "    m = torch.nn.Linear(4, 3)\n"
                "    def step(model, opt, x):\n"
                "        loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad(); return loss\n"
                "    return step, m, torch.optim.Adam(m.parameters()), torch.randn(5, 4)\n")
    out = os.path.join(tmp, "cli.json")
    proc = subprocess.run([sys.executable, "-m", "spmd_export", target + ":make", "-o", out], capture_output=True,
                          text=True, env=env)
    report("CLI: FILE.py:FUNCTION writes the dump and weights", proc.returncode == 0 and os.path.exists(out) and
           os.path.exists(os.path.join(tmp, "cli.weights.pt")), proc.stderr)
    # A relative -o: the dump names its weights relative to itself, where spmd looks first.
    os.makedirs(os.path.join(tmp, "sub"), exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "spmd_export", target + ":make", "-o", "sub/rel.json"],
                          capture_output=True, text=True, env=env, cwd=tmp)
    try:
        with open(os.path.join(tmp, "sub", "rel.json")) as f:
            named = json.load(f)["weights"]["file"]
    except (OSError, ValueError, KeyError) as e:
        named = repr(e)
    report("CLI: a relative weights path is the dump's", proc.returncode == 0 and named == "rel.weights.pt" and
           os.path.exists(os.path.join(tmp, "sub", "rel.weights.pt")), proc.stderr + named)

    # Every failure on the command line is one line, whatever raised it.
    bad = os.path.join(tmp, "bad.py")
    with open(bad, "w") as f:
        f.write("import torch\n"
                "def step(model, opt, x):\n"
                "    loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad(); return loss\n"
                "class Refusing(torch.nn.Linear):\n"
                "    def forward(self, x):\n"
                "        raise ValueError('no')\n"
                "def fused():\n"
                "    m = torch.nn.Linear(4, 3, device='meta')\n"
                "    o = torch.optim.Adam(m.parameters()); o.param_groups[0]['fused'] = True\n"
                "    return step, m, o, torch.randn(2, 4)\n"
                "def adagrad():\n"
                "    m = torch.nn.Linear(4, 3)\n"
                "    return step, m, torch.optim.Adagrad(m.parameters()), torch.randn(2, 4)\n"
                "def refusing():\n"
                "    m = Refusing(4, 3)\n"
                "    return step, m, torch.optim.SGD(m.parameters(), lr=0.1), torch.randn(2, 4)\n"
                "def broken():\n"
                "    return 1 / 0\n"
                "def three():\n"
                "    return 1, 2, 3\n"
                "def good():\n"
                "    m = torch.nn.Linear(4, 3)\n"
                "    return step, m, torch.optim.SGD(m.parameters(), lr=0.1, foreach=True), torch.randn(2, 4)\n")
    syntax = os.path.join(tmp, "syntax.py")
    with open(syntax, "w") as f:
        f.write("def make(:\n")
    expect_cli("fused=True without a fused kernel", "Adam(fused=True) needs its parameters on", [bad + ":fused"])
    expect_cli("unsupported optimizer", "Adagrad.step() reads tensor values in Python", [bad + ":adagrad"])
    expect_cli("forward raises", f"the train step raised ValueError: no (at {bad}:6)", [bad + ":refusing"])
    expect_cli("target function raises", f"{bad}:broken raised ZeroDivisionError: division by zero (at {bad}:18)",
               [bad + ":broken"])
    expect_cli("target returns the wrong thing", "must return (train_step, model, optimizer, batch), got 3 values",
               [bad + ":three"])
    expect_cli("file does not compile", f"cannot load {syntax}: SyntaxError", [syntax + ":make"])
    expect_cli("missing function", "has no function 'nothing'", [bad + ":nothing"])
    expect_cli("unwritable output", "cannot write", [bad + ":good", "-o", os.path.join(tmp, "no", "dir", "x.json")])
    expect_cli("no target", "the following arguments are required: target", [], code=2)
    expect_cli("unknown flag", "unrecognized arguments: --frobnicate", [bad + ":good", "--frobnicate"], code=2)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
