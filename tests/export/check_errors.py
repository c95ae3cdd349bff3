"""spmd_export's errors name their cause, as an exception from the API and as
one line with exit 1 from `python3 -m spmd_export`.

  check_errors.py        (python/ on PYTHONPATH, a python3 with torch)
"""
import os
import subprocess
import sys
import tempfile

import torch

import spmd_export

passed = failed = 0
tmp = tempfile.mkdtemp()


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

    # RMSprop (1.13) keeps its step count as a Python int: tracing would freeze it.
    rms = torch.optim.RMSprop(model.parameters())
    plain_step(model, rms, x)
    expect_error("Python number in optimizer state", "state 'step' of weight is a Python int", plain_step, model,
                 rms, x)

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
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
