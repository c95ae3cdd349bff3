"""torchrun on the Debian torch the project builds with (no libuv):
`python3 -m spmd_torchrun` runs torch.distributed.run with its stores' libuv as
USE_LIBUV says, and spmd-run and spmd-train under it, as the ranks torchrun
starts (its agent serving the store), train to the parameters spmd-run's own
launcher gives, bit for bit: default (static) rendezvous, --standalone and the
c10d backend.

  check_torchrun.py BIN_DIR PYTHON_DIR        (python3 with torch; from the repository root)
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import torch

BIN, PYDIR = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TMP = tempfile.mkdtemp()
passed = failed = 0


def report(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, env=None):
    return subprocess.run(args, capture_output=True, text=True, cwd=TMP, timeout=240,
                          env=dict(os.environ, PYTHONPATH=PYDIR, **(env or {})))


def same(a, b):
    a, b = torch.load(os.path.join(TMP, a)), torch.load(os.path.join(TMP, b))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def torchrun(*args):
    # --local-addr: this rank's address for the rendezvous, where the host's
    # name may not resolve (a CI machine's often does not).
    return [sys.executable, "-m", "spmd_torchrun", *args, "--nproc_per_node", "2", "--no_python"]


shutil.copy("samples/mlp.pt2", os.path.join(TMP, "model.pt2"))
step = os.path.join(TMP, "step.spmd")
made = run([os.path.join(BIN, "spmd-compile"), "model.pt2", "--optimizer", "sgd", "--lr",
            "0.001", "--momentum", "0.9", "--bucket-cap-mb", "0.05", "-o", step])
assert made.returncode == 0, made.stderr
own = run([os.path.join(BIN, "spmd-run"), step, "--nproc", "2", "--steps", "3", "--save-params", "own.pt"])
report("spmd-run --nproc 2 (the reference)", own.returncode == 0, own.stderr[-300:])

modes = [
    ("default rendezvous", ["--master-port", str(free_port())]),
    ("--standalone", ["--standalone", "--local-addr", "127.0.0.1"]),
    ("--rdzv-backend c10d", ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--nnodes", "1",
                             "--local-addr", "127.0.0.1"]),
]
for name, flags in modes:
    out = name.replace(" ", "_").replace("-", "") + ".pt"
    proc = run(torchrun(*flags) + [os.path.join(BIN, "spmd-run"), step, "--steps", "3", "--save-params", out])
    report(f"torchrun {name}: spmd-run trains as with its own launcher", proc.returncode == 0 and same("own.pt", out),
           proc.stderr[-500:])

# spmd-train under torchrun: every rank compiles, rank 0 writes the run's
# folder, and the user's model file stays where it was.
with open(os.path.join(TMP, "train.toml"), "w") as f:
    f.write('[model]\nfile = "model.pt2"\n[compile]\noptimizer = "sgd"\nlr = 0.001\n'
            'momentum = 0.9\nbucket-cap-mb = 0.05\n[run]\nsteps = 3\ndevice = "cpu"\n')
proc = run(torchrun("--master-port", str(free_port())) +
           [os.path.join(BIN, "spmd-train"), "train.toml", "--save-params", "train.pt"])
report("torchrun: spmd-train trains as spmd-run does", proc.returncode == 0 and same("own.pt", "train.pt") and
       open(os.path.join(TMP, "train.run/step.spmd"), "rb").read() == open(step, "rb").read(), proc.stderr[-500:])
report("torchrun: spmd-train leaves the model file it was given", os.path.exists(os.path.join(TMP, "model.pt2")))

# Plain torchrun on a torch without libuv still stops at its own store; the
# module is what makes it work there (on a torch with libuv both work).
if "USE_LIBUV=ON" not in torch.__config__.show():
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port()),
                            "--nproc_per_node", "2", "--no_python", "true"], capture_output=True, text=True,
                           cwd=TMP, timeout=120, env=dict(os.environ, USE_LIBUV="0"))
    report("plain torchrun fails on this torch (why spmd_torchrun exists)",
           plain.returncode != 0 and "libuv" in plain.stderr, plain.stderr[-300:])

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
