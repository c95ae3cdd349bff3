"""PyTorch DDP (NCCL, one GPU per rank) on a sample: parity reference and timing.

  ddp_gpu.py --sample mlp --nproc 2 --data DATA.pt --steps 5 --out REF.pt    # parity
  ddp_gpu.py --sample mlp --nproc 2 --time 200 --warmup 20 [--compile]        # median ms/step
  ddp_gpu.py ... [--autocast] [--sdpa]   # the forward under torch.autocast("cuda", bf16); lm: SDPA attention

The model is the sample's class with the TorchScript sample's weights; the
optimizer is Adam(lr=1e-2) (the seeds' test). DATA.pt follows spmd-run's data
contract ({input: [S, G, ...]}, rank r takes rows [r*G/N, (r+1)*G/N)). Timing
runs with TF32 matmuls on, as every system in the benchmark; parity in fp32. Timing prints one JSON
line: {"system": ..., "ranks": N, "median_ms": ..., "min_ms": ..., "max_ms": ...}.
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
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "samples"))
from models import SAMPLES  # noqa: E402


def model_for(sample, device):
    make, specs = SAMPLES[sample]
    model = make()
    model.load_state_dict(torch.jit.load(os.path.join(ROOT, "samples", sample + ".pt")).state_dict())
    return model.train().to(device), specs


def worker(rank, args, rendezvous):
    torch.cuda.set_device(rank)
    # TF32 for timing (as every system in the benchmark); full fp32 for parity.
    torch.backends.cuda.matmul.allow_tf32 = not args.data
    torch.backends.cudnn.allow_tf32 = not args.data
    # A file store, as bench/torch_step.py's: no port another job could take.
    dist.init_process_group("nccl", init_method="file://" + rendezvous, rank=rank, world_size=args.nproc)
    device = torch.device("cuda", rank)
    model, specs = model_for(args.sample, device)
    if args.sdpa:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_step import set_attention  # bench/torch_step.py: samples' Attention with SDPA
        set_attention(model, "sdpa")
    ddp = DDP(model, device_ids=[rank])
    step_fn = ddp
    if args.compile:
        step_fn = torch.compile(ddp)
    # Parity uses eps=1e-2, as tests/parity does: at 1e-8 Adam turns rounding
    # noise in near-zero gradients into full-size updates.
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2, eps=1e-2 if args.data else 1e-8)

    if args.data:
        data = torch.load(args.data)
        names = [s.split(":")[0] for s in specs]
        for s in range(args.steps):
            inputs = []
            for n in names:
                t = data[n][s % data[n].shape[0]]
                rows = t.shape[0] // args.nproc
                inputs.append(t[rank * rows:(rank + 1) * rows].to(device))
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.autocast):
                loss = step_fn(*inputs)
            loss.backward()
            opt.step()
        if rank == 0:
            torch.save({n: p.detach().cpu() for n, p in ddp.module.named_parameters()}, args.out)
    else:
        g = torch.Generator(device=device).manual_seed(rank)
        x = torch.randn(100, 100, device=device, generator=g)
        times = []
        for i in range(args.warmup + args.time):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad()
            step_fn(x).backward()
            opt.step()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1000)
        if rank == 0:
            print(json.dumps({"system": "torch.compile(DDP)" if args.compile else "DDP eager", "ranks": args.nproc,
                              "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sample", default="mlp")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--data")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--time", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--autocast", action="store_true", help="the forward under torch.autocast('cuda', bfloat16)")
    p.add_argument("--sdpa", action="store_true", help="attention by F.scaled_dot_product_attention (lm)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="spmd-bench-") as tmp:
        mp.spawn(worker, args=(args, os.path.join(tmp, "rendezvous")), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
