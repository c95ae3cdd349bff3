"""Times PyTorch's data-parallel training step on one benchmark model.

  python3 bench/torch_step.py --model NAME --system ddp|fsdp2|compile|max-autotune|reduce-overhead|
                              max-autotune-cudagraphs --nproc N
                              [--steps S=100] [--warmup W=10] [--device cuda|cpu] [--tiny]
                              [--precision fp32|bf16] [--attention math|sdpa]
                              [--optimizer-impl default|foreach|fused] [--cudnn-benchmark]
                              [--profile FILE] [--trace FILE.json]

Runs N ranks (NCCL on cuda, one GPU each; Gloo on cpu; N=1 in this process, more
spawned). Each rank wraps the model NAME of bench/models.py (same seeded weights as
the TorchScript spmd compiles) in DistributedDataParallel (also for N=1), with the
model's optimizer (Adam, AdamW, or SGD with momentum for resnet50; models.optimizer)
and TF32 matmuls on; ddp runs it eagerly, compile through torch.compile (default
mode), max-autotune through torch.compile(mode="max-autotune-no-cudagraphs"),
reduce-overhead and max-autotune-cudagraphs through the modes of those names that
replay CUDA graphs (each step marked with torch.compiler.cudagraph_mark_step_begin,
its loss copied out of the graph's memory before the next replay); fsdp2
wraps it in FSDP2's fully_shard instead of DDP (each block, then the model), eagerly.
--precision bf16 runs the forward under torch.autocast(device, torch.bfloat16)
(parameters, gradients and optimizer state stay fp32), and by default then runs a
model built on samples' Attention with its F.scaled_dot_product_attention(q, k, v,
is_causal=True) (--attention math swaps in samples' HandWrittenAttention: the same
modules and parameter names, only forward differs) and uses the fused optimizer
(--optimizer-impl fused; foreach where this torch has no fused kernel for the device). fp32 keeps math
attention and torch.optim's default. The models with attention of their own (gpt,
llama, the transformers models, vit_b_16) call F.scaled_dot_product_attention
themselves in every precision; --attention leaves them as they are ("attention":
models.py's note, e.g. "sdpa (the model's own)").
Inputs are drawn once per rank (models.rank_inputs: the batch bench.sh gives spmd-run
too). Each step (zero_grad(set_to_none=True), forward, backward, opt.step()) is timed
between two device synchronizations, as spmd-run times its steps; the first W steps are
left out. --profile and --trace profile 3 more steps after them (bench/trace_kernels.py
sums the trace's kernels). Rank 0 prints one JSON line: {"kind": "result", "system",
"model", "ranks", "precision", "median_ms", "min_ms", "max_ms", "losses_head" (the
first 5 steps' losses), "peak_bytes" (max_memory_allocated after the timed steps, as
spmd-run reports its own), "compile_s" (compile and
max-autotune: the first step, which compiles), "attention", "optimizer",
"optimizer_impl", ...}.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as bench_models  # noqa: E402  (bench/models.py)

# The systems that torch.compile the DDP module, and the mode each passes. reduce-overhead and
# max-autotune-cudagraphs run the step's graphs as CUDA graphs: the fastest wall time
# torch.compile offers a user, what spmd-run --cudagraphs is set against.
COMPILE_MODES = {"compile": "default", "max-autotune": "max-autotune-no-cudagraphs",
                 "reduce-overhead": "reduce-overhead", "max-autotune-cudagraphs": "max-autotune"}
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(bench_models.benches()))
    p.add_argument("--system", required=True, choices=["ddp", "fsdp2"] + sorted(COMPILE_MODES))
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--steps", type=int, default=100, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="the small models of smoke tests")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: the forward under torch.autocast(device, torch.bfloat16)")
    p.add_argument("--attention", choices=["math", "sdpa"],
                   help="samples' Attention: math or F.scaled_dot_product_attention (gpt and llama always "
                        "call SDPA themselves) "
                        "(default: sdpa for bf16, math for fp32)")
    p.add_argument("--optimizer-impl", choices=["default", "foreach", "fused"],
                   help="torch.optim's implementation (default: fused for bf16, torch's default for fp32; "
                        "fused falls back to foreach where torch has no fused kernel)")
    p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--profile", metavar="FILE",
                   help="after the timed steps, profile 3 more with torch.profiler; rank 0 writes the "
                        "table of ops by device time to FILE")
    p.add_argument("--trace", metavar="FILE",
                   help="after the timed steps, trace 3 more with torch.profiler (the same 3 as --profile's); "
                        "rank 0 writes their Chrome trace to FILE (bench/trace_kernels.py sums its kernels)")
    args = p.parse_args(argv)
    if args.nproc < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--nproc and --steps must be at least 1, --warmup at least 0")
    if args.system in COMPILE_MODES and args.warmup < 1:
        p.error("--system %s needs --warmup >= 1 (the first step compiles)" % args.system)
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        p.error("--nproc %d needs as many GPUs; %d visible" % (args.nproc, torch.cuda.device_count()))
    if args.system in COMPILE_MODES and not hasattr(torch, "compile"):
        p.error("--system %s needs PyTorch 2 (this is %s)" % (args.system, torch.__version__))
    if args.attention is None:
        args.attention = "sdpa" if args.precision == "bf16" else "math"
    if args.optimizer_impl is None:
        args.optimizer_impl = "fused" if args.precision == "bf16" else "default"
    return args


def enable_tf32(cudnn_benchmark=False):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = cudnn_benchmark


def set_attention(model, want, own):
    """Makes every samples Attention of model run as want (sdpa, as samples' Attention is
    written, or math: its class swapped in place for HandWrittenAttention, the same
    parameters written out); returns what runs: own (the bench's note on the model's own
    attention, None where it has none) where model has no samples Attention."""
    blocks = [m for m in model.modules() if isinstance(m, bench_models.Attention)]
    if not blocks:
        return own
    for module in blocks:
        module.__class__ = bench_models.HandWrittenAttention if want == "math" else bench_models.Attention
    return want


def make_optimizer(bench, params, impl):
    """(optimizer, implementation used): fused falls back to foreach where torch has no fused kernel."""
    params = list(params)
    if impl == "fused":
        try:
            return bench_models.optimizer(bench, params, fused=True), "fused"
        except (RuntimeError, TypeError, ValueError):
            impl = "foreach"
    if impl == "foreach":
        return bench_models.optimizer(bench, params, foreach=True), "foreach"
    return bench_models.optimizer(bench, params), "default"


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def setup(rank, args, rendezvous):
    """Joins the process group through the file `rendezvous` (local ranks only: a file
    store takes no port, so no other job on the machine can take it between choosing
    and binding); returns this rank's device."""
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
        # All ranks are local: Gloo on the loopback, not whatever the hostname resolves to.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="file://" + rendezvous,
                            rank=rank, world_size=args.nproc)
    return device


def teardown(rank, device):
    """Waits for every rank, then leaves the process group."""
    dist.barrier(device_ids=[rank]) if device.type == "cuda" else dist.barrier()
    dist.destroy_process_group()


def spawn(worker, args):
    """Runs worker(rank, args, rendezvous) on args.nproc local ranks that meet through a
    fresh file; one rank runs in this process (a spawned interpreter would import torch,
    and the model's libraries, again: seconds a run)."""
    with tempfile.TemporaryDirectory(prefix="spmd-bench-") as tmp:
        rendezvous = os.path.join(tmp, "rendezvous")
        if args.nproc == 1:
            worker(0, args, rendezvous)
        else:
            mp.spawn(worker, args=(args, rendezvous), nprocs=args.nproc, join=True)


def fsdp2(model):
    """FSDP2 as torchtitan applies it: fully_shard on every element of the model's
    nn.ModuleLists (the transformer blocks), then on the whole model; parameters
    resharded after the forward (its default), eager."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch before 2.6 kept it here
        from torch.distributed._composable.fsdp import fully_shard
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            for block in module:
                fully_shard(block)
    fully_shard(model)
    return model


def make_step(bench, args, device, rank):
    """(forward function, optimizer, inputs, notes): the wrapped model and its data on device;
    notes: what ran ({"attention", "optimizer_impl"})."""
    model = bench_models.build(bench)
    attention = set_attention(model, args.attention, bench.attention)
    model = model.to(device)
    if args.system == "fsdp2":
        ddp = fsdp2(model)
    else:
        ddp = DDP(model, device_ids=[rank] if device.type == "cuda" else None)
    fn = torch.compile(ddp, mode=COMPILE_MODES[args.system]) if args.system in COMPILE_MODES else ddp
    opt, impl = make_optimizer(bench, ddp.parameters(), args.optimizer_impl)
    inputs = [x.to(device) for x in bench_models.rank_inputs(bench, rank)]
    if args.precision == "bf16":
        def forward(*a):
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                return fn(*a)
    else:
        forward = fn
    notes = {"optimizer_impl": impl}
    if attention is not None:
        notes["attention"] = attention
    return forward, opt, inputs, notes


def time_steps(fn, opt, inputs, device, count, cuda_graphs=False):
    """Runs count steps; returns (ms per step, each step's loss). cuda_graphs: each step begins a
    new replay of torch.compile's CUDA graphs, and its loss is copied before the next overwrites it."""
    ms = []
    losses = []
    for _ in range(count):
        synchronize(device)
        begin = time.perf_counter()
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = fn(*inputs)
        loss.backward()
        opt.step()
        synchronize(device)
        ms.append((time.perf_counter() - begin) * 1000.0)
        losses.append(loss.detach().clone() if cuda_graphs else loss.detach())
    return ms, [x.item() for x in losses]


PROFILED_STEPS = 3


def profile_steps(fn, opt, inputs, device, path, trace_path, cuda_graphs=False):
    """Profiles 3 steps; writes torch.profiler's table of ops, by device time, to path (if given),
    and the Chrome trace to trace_path (if given), its step count under "spmd" as spmd-run --trace does."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        time_steps(fn, opt, inputs, device, PROFILED_STEPS, cuda_graphs)
    if trace_path:
        prof.export_chrome_trace(trace_path)
        with open(trace_path) as f:
            trace = json.load(f)
        trace["spmd"] = {"steps": PROFILED_STEPS, "device": device.type}
        with open(trace_path, "w") as f:
            json.dump(trace, f)
    if path:
        write_profile_table(prof, path)


def write_profile_table(prof, path):
    """torch.profiler's table of ops, by device time where the profile has it."""
    averages = prof.key_averages()
    for key in ("device_time_total", "cuda_time_total", "cpu_time_total"):
        try:
            table = averages.table(sort_by=key, row_limit=40)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    with open(path, "w") as f:
        f.write("# torch_step.py --profile: 3 steps, rank 0 (totals over the 3 steps)\n" + table + "\n")


def peak_bytes(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def summary(args, bench, ms, losses, peak, notes):
    timed = ms[args.warmup:]
    row = {"kind": "result", "system": args.system, "model": args.model, "ranks": args.nproc,
           "device": args.device, "steps": args.steps, "warmup": args.warmup, "precision": args.precision,
           "median_ms": statistics.median(timed), "min_ms": min(timed), "max_ms": max(timed),
           "peak_bytes": peak, "first_step_ms": ms[0], "loss_last": losses[-1],
           "losses_head": losses[:5], "torch": torch.__version__,
           "optimizer": bench.optimizer, "cudnn_benchmark": args.cudnn_benchmark}
    if args.precision == "bf16":
        row["autocast"] = "%s:bf16" % args.device
    row.update(notes)
    if args.system in COMPILE_MODES:
        row["compile_mode"] = COMPILE_MODES[args.system]
        row["compile_s"] = ms[0] / 1000.0
    return row


def worker(rank, args, rendezvous):
    enable_tf32(args.cudnn_benchmark)
    device = setup(rank, args, rendezvous)
    bench = bench_models.benches(args.tiny)[args.model]
    fn, opt, inputs, notes = make_step(bench, args, device, rank)
    graphs = device.type == "cuda" and COMPILE_MODES.get(args.system) in CUDA_GRAPH_MODES
    ms, losses = time_steps(fn, opt, inputs, device, args.warmup + args.steps, graphs)
    peak = peak_bytes(device)
    if (args.profile or args.trace) and rank == 0:
        profile_steps(fn, opt, inputs, device, args.profile, args.trace, graphs)
    elif args.profile or args.trace:
        time_steps(fn, opt, inputs, device, PROFILED_STEPS, graphs)  # rank 0's profiled steps all-reduce with these
    if rank == 0:
        print(json.dumps(summary(args, bench, ms, losses, peak, notes)), flush=True)
    teardown(rank, device)


def main():
    spawn(worker, parse_args())


if __name__ == "__main__":
    main()
