"""Writes bench.sh's results.jsonl lines (one JSON object per line, on stdout).

  record.py machine [--note TEXT]...                   # date, GPUs, driver, torch, NCCL
  record.py spmd --model M --ranks N --steps S --warmup W [--warmup-excluded]
                 [--precision fp32|bf16] [--expand-flags TEXT] < RUN.json
  record.py pipeline --model M [--precision P] --seconds T...   # wall times of expand|...|lower
  record.py compile-time --model M --bytes N --copy T... --startup T... --stage NAME T... ... --pipeline T...
  record.py device-time --system S --model M --ranks N [--precision P] --sums FILE   # trace_kernels.py --json's
  record.py skipped --system S --model M [--ranks N] [--precision P] --why TEXT
  record.py error --system S --model M [--ranks N] [--precision P] [--log FILE] --what TEXT

`spmd` turns spmd-run's --json object ({"ranks", "ms_per_step": {...}, "peak_bytes",
"losses", ...}) into the line torch_step.py prints for PyTorch; `device-time` records
the device milliseconds and kernels a step that bench/trace_kernels.py summed from a
system's trace; `skipped` a run that was not made, or was cut off, and why (no
failure); `error` keeps the last lines of the failed command's log so that report.py
can show why. --precision (default fp32 for spmd, pipeline and device-time, none for
skipped and error) is the row's precision, as torch_step.py --precision records it:
bf16 for an artifact expanded with --autocast.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys


def emit(row):
    print(json.dumps(row), flush=True)


def nvidia_smi(query):
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def git_commit():
    # A copy of the tree without its history (the GPU machine's) names the
    # commit it was made from in SPMD_COMMIT; its own git would be stale.
    if os.environ.get("SPMD_COMMIT"):
        return os.environ["SPMD_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine(args):
    import torch
    row = {"kind": "machine", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "host_cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
           "commit": git_commit(), "notes": [" ".join(n.split()) for n in args.note or []]}
    if torch.cuda.is_available():
        nccl = torch.cuda.nccl.version()
        row.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(), cuda=torch.version.cuda,
                   nccl=".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl))
        drivers = nvidia_smi("driver_version")
        row["driver"] = drivers[0] if drivers else None
    else:
        row.update(gpu=None, gpus=0)
    row["env"] = {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES") if k in os.environ}
    emit(row)


# Each result row keeps its first few steps' losses: systems that start from the same weights on
# the same batch agree there up to rounding, so a disagreement names a numerics bug, not chaos.
LOSSES_HEAD = 5


def spmd(args):
    text = sys.stdin.read()
    run = json.loads(text.strip().splitlines()[-1])
    ms = run["ms_per_step"]
    losses = run.get("losses") or []
    row = {"kind": "result", "system": "spmd", "model": args.model, "ranks": run.get("ranks", args.ranks),
           "device": run.get("device"), "steps": args.steps, "warmup": args.warmup, "precision": args.precision,
           "warmup_excluded": args.warmup_excluded, "median_ms": ms["median"], "min_ms": ms["min"],
           "max_ms": ms["max"], "peak_bytes": run.get("peak_bytes"), "loss_last": losses[-1] if losses else None,
           "losses_head": losses[:LOSSES_HEAD]}
    if args.expand_flags:
        row["expand_flags"] = args.expand_flags
    # Whatever else spmd-run reports (notes on partial lowering, say) travels along.
    row.update({k: v for k, v in run.items() if k not in row and k not in ("losses", "ms_per_step")})
    emit(row)


def pipeline(args):
    emit({"kind": "pipeline", "model": args.model, "precision": args.precision, "runs_s": args.seconds,
          "median_s": statistics.median(args.seconds)})


def compile_time(args):
    """Issue #18: medians of the model file's read-and-copy, tool start-up, each stage and the piped pipeline."""
    med = statistics.median
    stages = {name: {"runs_s": runs, "median_s": med(runs)} for name, *runs in
              ((s[0], *map(float, s[1:])) for s in args.stage)}
    emit({"kind": "compile_time", "model": args.model, "precision": args.precision, "model_bytes": args.bytes,
          "copy_s": med(args.copy), "startup_s": med(args.startup), "stages": stages,
          "pipeline_s": med(args.pipeline), "pipeline_runs_s": args.pipeline,
          "ratio_to_copy": med(args.pipeline) / med(args.copy),
          **({"compile_s": med(args.compile), "compile_runs_s": args.compile} if args.compile else {})})


def device_time(args):
    with open(args.sums) as f:
        sums = json.load(f)
    emit({"kind": "device_time", "system": args.system, "model": args.model, "ranks": args.ranks,
          "precision": args.precision, "device_ms": sums["device_ms"], "kernels": sums["kernels"],
          "trace_steps": sums["steps"], "by_kind": sums.get("by_kind", {})})


def skipped(args):
    emit({"kind": "skipped", "system": args.system, "model": args.model, "ranks": args.ranks,
          "precision": args.precision, "why": args.why})


def tail(path, lines=12):
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip("\n") for line in f.readlines()[-lines:]]
    except OSError:
        return []


def error(args):
    row = {"kind": "error", "system": args.system, "model": args.model, "ranks": args.ranks, "what": args.what,
           "log_tail": tail(args.log) if args.log else []}
    if args.precision:
        row["precision"] = args.precision
    emit(row)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("machine")
    m.add_argument("--note", action="append")
    s = sub.add_parser("spmd")
    s.add_argument("--model", required=True)
    s.add_argument("--ranks", type=int)
    s.add_argument("--steps", type=int)
    s.add_argument("--warmup", type=int)
    s.add_argument("--warmup-excluded", action="store_true")
    s.add_argument("--precision", default="fp32")
    s.add_argument("--expand-flags", help="the spmd-expand flags that set the precision (e.g. --autocast cuda:bf16)")
    c = sub.add_parser("pipeline")
    c.add_argument("--model", required=True)
    c.add_argument("--precision", default="fp32")
    c.add_argument("--seconds", type=float, nargs="+", required=True)
    t = sub.add_parser("compile-time")
    t.add_argument("--model", required=True)
    t.add_argument("--precision", default="fp32")
    t.add_argument("--bytes", type=int, required=True, help="the model file's size")
    t.add_argument("--copy", type=float, nargs="+", required=True, help="seconds to read the model file and write a copy")
    t.add_argument("--startup", type=float, nargs="+", required=True, help="seconds of spmd-split --help")
    t.add_argument("--stage", nargs="+", action="append", required=True, metavar="NAME SECONDS",
                   help="a stage's name, then its run times (repeatable)")
    t.add_argument("--pipeline", type=float, nargs="+", required=True, help="seconds of the piped pipeline")
    t.add_argument("--compile", type=float, nargs="+", help="seconds of spmd-compile (the four stages in one process)")
    d = sub.add_parser("device-time")
    d.add_argument("--system", required=True)
    d.add_argument("--model", required=True)
    d.add_argument("--ranks", type=int, required=True)
    d.add_argument("--precision", default="fp32")
    d.add_argument("--sums", required=True, help="bench/trace_kernels.py --json's file")
    k = sub.add_parser("skipped")
    k.add_argument("--system", required=True)
    k.add_argument("--model")
    k.add_argument("--ranks", type=int)
    k.add_argument("--precision")
    k.add_argument("--why", required=True)
    e = sub.add_parser("error")
    e.add_argument("--system", required=True)
    e.add_argument("--model")
    e.add_argument("--ranks", type=int)
    e.add_argument("--precision")
    e.add_argument("--log")
    e.add_argument("--what", required=True)
    args = p.parse_args()
    {"machine": machine, "spmd": spmd, "pipeline": pipeline, "compile-time": compile_time,
     "device-time": device_time, "skipped": skipped, "error": error}[args.cmd](args)


if __name__ == "__main__":
    main()
