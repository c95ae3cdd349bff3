"""Times all_reduce on N ranks: the bus bandwidth a data-parallel step can reach.

  python3 bench/allreduce.py --nproc N [--sizes-mb 25,256,1024] [--iters 20] [--warmup 5]
                             [--device cuda|cpu]

Spawns N ranks (NCCL on cuda, one GPU each; Gloo on cpu). For each size, rank 0
prints one JSON line {"kind": "allreduce", "ranks", "device", "bytes", "median_ms",
"algbw_gbps", "busbw_gbps"}: fp32 sum all-reduces timed one by one between two
synchronisations; algbw = bytes / time, busbw = algbw * 2 (N - 1) / N (nccl-tests'
formula for all_reduce: the traffic each link carries, comparable across N).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import setup, spawn, synchronize, teardown  # noqa: E402  (bench/torch_step.py)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--sizes-mb", default="25,256,1024", help="comma-separated buffer sizes in MiB")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args(argv)
    if args.nproc < 2 or args.iters < 1 or args.warmup < 0:
        p.error("--nproc must be at least 2, --iters at least 1, --warmup at least 0")
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        p.error("--nproc %d needs as many GPUs; %d visible" % (args.nproc, torch.cuda.device_count()))
    try:
        args.sizes = [float(s) for s in args.sizes_mb.split(",")]
    except ValueError:
        p.error("--sizes-mb: expected numbers separated by commas, got %r" % args.sizes_mb)
    return args


def time_allreduce(buf, device, iters, warmup):
    ms = []
    for i in range(warmup + iters):
        synchronize(device)
        begin = time.perf_counter()
        dist.all_reduce(buf)
        synchronize(device)
        if i >= warmup:
            ms.append((time.perf_counter() - begin) * 1000.0)
    return statistics.median(ms)


def worker(rank, args, rendezvous):
    device = setup(rank, args, rendezvous)
    for mb in args.sizes:
        numel = int(mb * 1024 * 1024) // 4
        buf = torch.ones(numel, dtype=torch.float32, device=device)
        median = time_allreduce(buf, device, args.iters, args.warmup)
        nbytes = numel * 4
        algbw = nbytes / (median / 1000.0) / 1e9
        if rank == 0:
            print(json.dumps({"kind": "allreduce", "ranks": args.nproc, "device": args.device, "bytes": nbytes,
                              "median_ms": median, "algbw_gbps": algbw,
                              "busbw_gbps": algbw * 2 * (args.nproc - 1) / args.nproc}), flush=True)
        del buf
    teardown(rank, device)


def main():
    spawn(worker, parse_args())


if __name__ == "__main__":
    main()
