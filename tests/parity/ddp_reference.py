"""The oracle for spmd's data-parallel parity tests: PyTorch's own
DistributedDataParallel (Gloo, CPU, N ranks as local processes) trained for S
steps from a sample's weights on random data.

  ddp_reference.py --sample mlp|lm|cnn | --zoo --sample NAME --optimizer sgd|adam|adamw --lr F
      [--momentum F] [--dampening F] [--nesterov] [--weight-decay F]
      [--betas B1,B2] [--eps F] [--amsgrad]
      --nproc N --steps S --data DATA.pt --out REF.pt
      [--bucket-cap-mb F] [--first-bucket-cap-mb F] [--ignore-param NAME ...] [--seed K] [--model-pt PATH]
      [--autocast cpu:bf16] [--reduce-dtype bf16|f16] [--all-ranks] [--verbose]
      [--lr-schedule constant|linear|cosine|step [--warmup-steps W] [--decay-steps D] [--min-lr M]
       [--step-size K] [--gamma G]] [--clip-grad-norm MAX [--clip-grad-norm-type 2|inf]]
      [--micro-batches N] [--zoo-module PY]

Run with a python that imports torch (Debian's /usr/bin/python3). It

- builds the sample's model class from samples/models.py (the constructor that
  samples.SAMPLES uses; with --zoo, tests/zoo/zoo.py's ZOO), loads the weights
  of the TorchScript sample (samples/X.pt, or --model-pt) strictly, and puts
  it in train mode;
- writes DATA.pt, spmd-run's --data contract: {input name: tensor [S, G, ...]}
  with G the global batch (N x the per-rank batch of samples.SAMPLES); floats
  are randn, int64 inputs randint(0, 64), all from one generator seeded --seed;
- trains N ranks under DDP (device_ids=None, broadcast_buffers=True,
  bucket_cap_mb, parameters_to_ignore from --ignore-param, the first bucket's
  cap from --first-bucket-cap-mb, else DDP's 1 MiB): at step s rank r
  reads rows [r*G/N, (r+1)*G/N) of DATA[input][s % S] and runs zero_grad,
  loss = model(*inputs), loss.backward(), opt.step(); F.scaled_dot_product_attention
  picks its kernel as eager PyTorch does (spmd calls the same);
- with --autocast cpu:bf16 runs the forward (model(*inputs), which returns the
  loss) under torch.autocast("cpu", dtype=torch.bfloat16), backward and step
  outside it, as PyTorch's AMP recipe does; with --reduce-dtype bf16|f16
  registers DDP's bf16_compress_hook / fp16_compress_hook (the bucket cast,
  divided by the world size, all-reduced, cast back);
- with --lr-schedule sets each step's learning rate on the optimizer's
  param_groups before opt.step(): nanoGPT's get_lr for cosine (warmup
  lr * (it + 1) / (W + 1), then cosine from lr to M at D), the same warmup
  then a linear decay for linear, and torch.optim.lr_scheduler.StepLR's rate
  for step (after the warmup); with --clip-grad-norm calls
  torch.nn.utils.clip_grad_norm_ between backward and step; with
  --micro-batches N splits each rank's rows (N x the sample's batch) into N
  consecutive micro-batches, runs the first N-1 under ddp.no_sync(), each
  loss divided by N, as nanoGPT's loop does (the step's loss is their sum);
- has rank 0 write REF.pt, {name: tensor} of its named_parameters() (no
  "module." prefix) after S steps, REF.losses.pt (rank 0's per-step local
  losses, a 1-D tensor) and REF.buffers.pt ({name: tensor}, rank 0's buffers
  after S steps); with --all-ranks every rank r also writes REF.rankR.pt.
  (REF.losses.pt means REF with a trailing ".pt" replaced, else appended.)

Each rank runs with one intra-op thread, so two runs give identical results.
"""
import argparse
import contextlib
import datetime
import faulthandler
import math
import os
import re
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "samples"))
sys.path.insert(0, os.path.join(ROOT, "tests", "zoo"))

from models import SAMPLES  # noqa: E402


def models_of(a):
    """SAMPLES, or with --zoo tests/zoo's models (they need torchvision), which
    keep the same contract. Looked up, not passed: ranks cannot pickle them."""
    if not a.zoo:
        return SAMPLES
    if a.zoo_module:  # another file's ZOO (tests/zoo/sweep_torchvision.py)
        import importlib.util
        spec = importlib.util.spec_from_file_location("extra_zoo", a.zoo_module)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.ZOO
    from zoo import ZOO
    return ZOO

DTYPES = {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64, "i32": torch.int32}
TOKEN_RANGE = 64  # TinyLM's vocabulary


def parse_spec(spec):
    """'x:f32[100,100]' -> ('x', torch.float32, [100, 100])."""
    m = re.fullmatch(r"(\w+):(\w+)\[([0-9, ]*)\]", spec)
    if not m or m.group(2) not in DTYPES:
        raise ValueError(f"bad input spec {spec!r}")
    dims = [int(d) for d in m.group(3).split(",") if d.strip()]
    return m.group(1), DTYPES[m.group(2)], dims


def sibling(path, suffix):
    """REF.pt + '.losses.pt' -> REF.losses.pt."""
    stem = path[:-3] if path.endswith(".pt") else path
    return stem + suffix


def make_data(specs, nproc, steps, seed, micro_batches=1):
    """{name: [S, G, ...]} with G = nproc x micro_batches x the batch (dim 0 of the spec)."""
    g = torch.Generator().manual_seed(seed)
    data = {}
    for spec in specs:
        name, dtype, dims = parse_spec(spec)
        if not dims:
            raise ValueError(f"input {name} has no batch dimension")
        shape = [steps, nproc * micro_batches * dims[0]] + dims[1:]
        if dtype.is_floating_point:
            data[name] = torch.randn(shape, generator=g, dtype=dtype)
        else:
            data[name] = torch.randint(0, TOKEN_RANGE, shape, generator=g, dtype=dtype)
    return data


def make_optimizer(params, a):
    if a.optimizer == "sgd":
        cls, kwargs = torch.optim.SGD, dict(lr=a.lr, momentum=a.momentum, dampening=a.dampening,
                                            nesterov=a.nesterov, weight_decay=a.weight_decay or 0.0)
    else:
        betas = tuple(float(b) for b in a.betas.split(","))
        cls = torch.optim.Adam if a.optimizer == "adam" else torch.optim.AdamW
        wd = a.weight_decay if a.weight_decay is not None else (0.0 if a.optimizer == "adam" else 1e-2)
        kwargs = dict(lr=a.lr, betas=betas, eps=a.eps, weight_decay=wd, amsgrad=a.amsgrad)
    if a.zero_redundancy:
        # ZeRO-1 as PyTorch ships it: each rank keeps the state of a part of the parameters.
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, **kwargs)
    return cls(params, **kwargs)


def nanogpt_lr(it, a):
    """nanoGPT's get_lr, and its linear and constant variants."""
    if it < a.warmup_steps:
        return a.lr * (it + 1) / (a.warmup_steps + 1)
    if a.lr_schedule == "constant":
        return a.lr
    if it > a.decay_steps:
        return a.min_lr
    decay_ratio = (it - a.warmup_steps) / (a.decay_steps - a.warmup_steps)
    if a.lr_schedule == "linear":
        return a.lr + decay_ratio * (a.min_lr - a.lr)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return a.min_lr + coeff * (a.lr - a.min_lr)


class Schedule:
    """The learning rate of each step, set on the optimizer before its step."""

    def __init__(self, opt, a):
        self.opt, self.a = opt, a
        # StepLR itself for the step schedule, started once the warmup ends.
        self.step_lr = None

    def set_for(self, it):
        a = self.a
        if a.lr_schedule is None:
            return
        if a.lr_schedule != "step":
            lr = nanogpt_lr(it, a)
        elif it < a.warmup_steps:
            lr = a.lr * (it + 1) / (a.warmup_steps + 1)
        else:
            if self.step_lr is None:
                for group in self.opt.param_groups:
                    group["lr"] = a.lr
                self.step_lr = torch.optim.lr_scheduler.StepLR(self.opt, step_size=a.step_size, gamma=a.gamma)
            else:
                self.step_lr.step()
            return
        for group in self.opt.param_groups:
            group["lr"] = lr


def train_step(ddp, opt, inputs, a, autocast_dtype):
    """One step: forward and backward per micro-batch (all but the last under
    no_sync), clipping, the update. Returns the step's loss."""
    n = a.micro_batches
    rows = inputs[0].shape[0] // n
    total = None
    opt.zero_grad()
    for k in range(n):
        micro = [t[k * rows:(k + 1) * rows] for t in inputs]
        sync = contextlib.nullcontext() if k == n - 1 else ddp.no_sync()
        with sync:
            if autocast_dtype is not None:
                with torch.autocast("cpu", dtype=autocast_dtype):
                    loss = ddp(*micro)
            else:
                loss = ddp(*micro)
            if n > 1:
                loss = loss / n
            loss.backward()
        total = loss.detach().clone() if total is None else total + loss.detach()
    if a.clip_grad_norm is not None:
        norm_type = float("inf") if a.clip_grad_norm_type == "inf" else 2.0
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), a.clip_grad_norm, norm_type)
    opt.step()
    return total


def load_weights(model, state):
    """model.load_state_dict(state, strict=True), with the eager model's module
    versions: a TorchScript state_dict (and a dict copied from one) has no
    _metadata, and a module that converts old checkpoints would take it for one
    (torchvision's MNASNet with alpha != 1 rebuilds its stem as version 1's)."""
    full = model.state_dict()
    if set(full) != set(state):
        model.load_state_dict(state, strict=True)  # raises, naming the keys
    full.update(state)
    model.load_state_dict(full, strict=True)


def build_model(a):
    """The sample's eager model with the TorchScript sample's weights, train mode."""
    model = models_of(a)[a.sample][0]()
    scripted = torch.jit.load(a.model_pt, map_location="cpu")
    load_weights(model, scripted.state_dict())
    return model.train()


def worker(rank, a, store_path, state, data):
    # A rank that hangs prints where, well before run_parity.py's timeout.
    faulthandler.dump_traceback_later(240, exit=True)
    # all ranks are local: keep Gloo off whatever interface the hostname resolves to
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    # A file store, not a TCP port: a port picked free here can be taken by
    # another reference run of a parallel ctest before rank 0 binds it, and
    # ranks of two runs meeting in one store hang.
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                            world_size=a.nproc, timeout=datetime.timedelta(seconds=120))
    try:
        model = models_of(a)[a.sample][0]()
        load_weights(model, state)
        model.train()
        if a.first_bucket_cap_mb is not None:
            # DDP reads this at construction for its first bucket (default 1 MiB)
            dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.first_bucket_cap_mb * 1024 * 1024)
        if a.ignore_param:
            DDP._set_params_and_buffers_to_ignore_for_model(model, list(a.ignore_param))
        ddp = DDP(model, device_ids=None, broadcast_buffers=True, bucket_cap_mb=a.bucket_cap_mb)
        if a.reduce_dtype:
            hook = {"bf16": default_hooks.bf16_compress_hook, "f16": default_hooks.fp16_compress_hook}[a.reduce_dtype]
            ddp.register_comm_hook(None, hook)
        opt = make_optimizer(ddp.parameters(), a)
        autocast_dtype = {"bf16": torch.bfloat16}[a.autocast.split(":")[1]] if a.autocast else None
        names = list(data)
        rows = data[names[0]].shape[1] // a.nproc
        losses = []
        schedule = Schedule(opt, a)
        for s in range(a.steps):
            inputs = [data[n][s % data[n].shape[0], rank * rows:(rank + 1) * rows] for n in names]
            schedule.set_for(s)
            loss = train_step(ddp, opt, inputs, a, autocast_dtype)
            losses.append(loss)
            if a.verbose and rank == 0:
                buckets = [b.buffer().numel() * b.buffer().element_size()
                           for b in ddp.reducer._get_zeros_like_grad_buckets()]
                print(f"rank 0 step {s}: loss {loss.item():.6g}, DDP bucket bytes {buckets}",
                      file=sys.stderr)
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        if a.all_ranks:
            torch.save(params, sibling(a.out, f".rank{rank}.pt"))
        if a.zero_redundancy:
            opt.consolidate_state_dict(to=0)
            if rank == 0:
                torch.save(opt.state_dict(), a.zero_redundancy)
        if rank == 0:
            torch.save(params, a.out)
            torch.save(torch.stack(losses), sibling(a.out, ".losses.pt"))
            torch.save({n: b.detach().clone() for n, b in model.named_buffers()},
                       sibling(a.out, ".buffers.pt"))
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_without_teardown()


def leave_without_teardown():
    """Ends a rank whose files are written, without freeing DDP and its process group.

    Seen in CI (lm_adamw_autocast_bf16_reduce_f16): a rank
    hung after worker returned, its main thread in mp.spawn's _wrap, that is
    in freeing worker's locals, and another thread with no Python frame. It
    did not recur in 40 runs here. The likely cause: the DDP object holds
    the last reference to the Gloo process group, so the group's destructor
    runs there, holding the GIL, and joins Gloo's threads; a Gloo thread
    that needs the GIL then (the comm hook's futures hold Python callbacks)
    waits for ever. Nothing is left to do after the barrier, so the rank
    exits here and skips that teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sample", required=True, help="a sample (%s) or, with --zoo, a model of tests/zoo" %
                   ", ".join(sorted(SAMPLES)))
    p.add_argument("--zoo", action="store_true", help="--sample names a model of tests/zoo/zoo.py")
    p.add_argument("--zoo-module", metavar="PY", help="with --zoo: the ZOO of this Python file, not tests/zoo/zoo.py's")
    p.add_argument("--optimizer", required=True, choices=["sgd", "adam", "adamw"])
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--dampening", type=float, default=0.0)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=None, help="0; adamw: 1e-2")
    p.add_argument("--betas", default="0.9,0.999")
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--amsgrad", action="store_true")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--data", required=True, help="where to write the data file")
    p.add_argument("--out", required=True, help="where rank 0 writes its parameters")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (25)")
    p.add_argument("--first-bucket-cap-mb", type=float, default=None,
                   help="DDP's first bucket cap (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB)")
    p.add_argument("--ignore-param", action="append", default=[], metavar="NAME",
                   help="a parameter DDP leaves unsynchronised (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="data seed (0)")
    p.add_argument("--model-pt", default=None, help="TorchScript weights (samples/SAMPLE.pt)")
    p.add_argument("--autocast", choices=["cpu:bf16"], help="the forward under torch.autocast")
    p.add_argument("--reduce-dtype", choices=["bf16", "f16"], help="DDP's compression hook for that dtype")
    p.add_argument("--lr-schedule", choices=["constant", "linear", "cosine", "step"])
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--decay-steps", type=int, default=0)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--step-size", type=int, default=1)
    p.add_argument("--gamma", type=float, default=0.1)
    p.add_argument("--clip-grad-norm", type=float, default=None)
    p.add_argument("--clip-grad-norm-type", choices=["2", "inf"], default="2")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--all-ranks", action="store_true", help="also write REF.rankR.pt for every rank")
    p.add_argument("--zero-redundancy", metavar="OPT.pt",
                   help="train with torch.distributed.optim.ZeroRedundancyOptimizer and write its consolidated "
                        "state_dict() to OPT.pt")
    p.add_argument("-v", "--verbose", action="store_true", help="rank 0 prints its loss and DDP buckets per step")
    a = p.parse_args()
    if a.sample not in models_of(a):
        p.error(f"--sample {a.sample}: no such model (have: {', '.join(sorted(models_of(a)))})")
    if a.lr is None:
        if a.optimizer == "sgd":
            p.error("--lr is required for sgd")
        a.lr = 1e-3
    if a.nproc < 1 or a.steps < 1:
        p.error("--nproc and --steps must be positive")
    if a.model_pt is None:
        if a.zoo:
            p.error("--zoo needs --model-pt (tests/zoo/gen_zoo.py writes the models)")
        a.model_pt = os.path.join(ROOT, "samples", a.sample + ".pt")

    model = build_model(a)
    param_names = {n for n, _ in model.named_parameters()}
    for n in a.ignore_param:
        if n not in param_names:
            p.error(f"--ignore-param {n}: no such parameter (have: {', '.join(sorted(param_names))})")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    if a.warmup_steps and a.lr_schedule is None:
        a.lr_schedule = "constant"
    data = make_data(models_of(a)[a.sample][1], a.nproc, a.steps, a.seed, a.micro_batches)
    torch.save(data, a.data)

    store_path = os.path.abspath(sibling(a.out, ".store"))
    if os.path.exists(store_path):
        os.remove(store_path)  # a file store must start empty
    try:
        mp.spawn(worker, args=(a, store_path, state, data), nprocs=a.nproc, join=True)
    except Exception:  # a rank's failure, with its traceback
        traceback.print_exc()
        print("ddp_reference.py: a rank failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
