#!/usr/bin/env python3
"""Sums the device work in a Chrome trace by kernel: spmd-run --trace's, or torch_step.py --trace's
(torch.profiler's). Prints the device time and launches a step, by kind (GEMMs, spmd's generated
kernels, Triton's, ATen's others, copies) and by kernel, slowest first.

    python3 bench/trace_kernels.py TRACE.json [--top N] [--json FILE] [--by-op]

A trace names its step count under "spmd" (both writers put it there). Device time is the sum of
the kernels' own durations: where streams overlap it is more than the wall time. --json also writes
the sums a step to FILE ({"steps", "device", "device_ms", "kernels" (kernels and copies), "by_kind":
{kind: {"ms", "calls"}}}), which bench.sh records as the step's device time.

--by-op adds a table of the device work by the op that launched it: the outermost op on the
launching thread (spmd-run's node, or an ATen op of torch's step) and the op under it that made
the call (aten::copy_ inside spmd::fused_attention_backward, say), with the kernel's name. A kernel
is tied to its op through the trace's correlation ids (spmd-run's "launched_by" and "correlation",
torch.profiler's "External id"); one the trace does not tie is listed as not mapped.

Host-to-device copies on a stream other than the one that ran most of the work are listed as
"overlapped upload" and left out of the device time: they are spmd-run's copies of the next step's
batch, which run on a copy engine while the step computes (torch_step.py keeps its batch on the
device and copies nothing)."""
import argparse
import collections
import json
import re
import sys

KINDS = [  # first match wins
    ("gemm", re.compile(r"gemm|xmma|cutlass|cublas|s1688|s16816|nvjet|sm90_|sm80_", re.I)),
    ("spmd generated", re.compile(r"^spmd_")),
    ("triton", re.compile(r"^triton_")),
    ("copy/fill", re.compile(r"^Memcpy|^Memset|copy_kernel|fill_kernel|FillFunctor|CatArray", re.I)),
    ("nccl", re.compile(r"nccl", re.I)),
]
DEVICE_CATEGORIES = {"gpu", "kernel", "gpu_memcpy", "gpu_memset"}  # spmd's, then torch.profiler's


def kind_of(name):
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other ATen/CUDA"


OVERLAPPED_UPLOAD = "overlapped upload"


def device_events(trace):
    """(name, microseconds, kind) of each device event."""
    events = [(e["name"], float(e.get("dur", 0.0)), (e.get("pid"), e.get("tid"))) for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    busy = collections.Counter()
    for _, us, stream in events:
        busy[stream] += us
    main_stream = busy.most_common(1)[0][0] if busy else None
    for name, us, stream in events:
        upload = name.startswith("Memcpy HtoD") and stream != main_stream
        yield name, us, OVERLAPPED_UPLOAD if upload else kind_of(name)


def table(rows, steps, total, top):
    lines = ["# ms/step   share  calls/step   us/call  name"]
    for name, (us, calls) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        short = name if len(name) <= 110 else name[:107] + "..."
        lines.append("%9.3f  %5.1f%%  %10.1f  %8.1f  %s" % (us / steps / 1e3, 100 * us / total if total else 0,
                                                           calls / steps, us / calls, short))
    return lines


def step_count(trace, source):
    steps = trace.get("spmd", {}).get("steps")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError("%s names no step count (\"spmd\": {\"steps\": N}): not written by spmd-run --trace "
                         "or torch_step.py --trace" % source)
    return steps


def sums(trace):
    """({kernel name: [us, calls]}, {kind: [us, calls]}) over the whole trace."""
    by_name, by_kind = collections.defaultdict(lambda: [0.0, 0]), collections.defaultdict(lambda: [0.0, 0])
    for name, us, kind in device_events(trace):
        for acc in (by_name[name] if kind != OVERLAPPED_UPLOAD else by_name[kind + ": " + name], by_kind[kind]):
            acc[0] += us
            acc[1] += 1
    return by_name, by_kind


def step_totals(by_kind):
    """Microseconds and launches of the step's own work (overlapped uploads left out)."""
    own = [v for kind, v in by_kind.items() if kind != OVERLAPPED_UPLOAD]
    return sum(us for us, _ in own), sum(calls for _, calls in own)


def summarize(trace, top, source):
    steps = step_count(trace, source)
    by_name, by_kind = sums(trace)
    total, launches = step_totals(by_kind)
    head = ["# %s: %d steps on %s; a step: %.3f ms of device time in %.1f kernels and copies"
            % (source, steps, trace["spmd"].get("device", "?"), total / steps / 1e3, launches / steps)]
    return "\n".join(head + ["# by kind"] + table(by_kind, steps, total, top) + ["# by kernel"]
                     + table(by_name, steps, total, top)) + "\n"


def per_step(trace, source):
    """The sums a step, for results.jsonl: device milliseconds and kernels (and copies), in all and by kind."""
    steps = step_count(trace, source)
    _, by_kind = sums(trace)
    total, launches = step_totals(by_kind)
    return {"steps": steps, "device": trace["spmd"].get("device"), "device_ms": total / steps / 1e3,
            "kernels": launches / steps,
            "by_kind": {kind: {"ms": us / steps / 1e3, "calls": calls / steps}
                        for kind, (us, calls) in by_kind.items()}}


def cpu_ops(trace):
    """{link id: (the op, the outermost op around it on its thread)} of the trace's CPU events."""
    by_thread = collections.defaultdict(list)
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") not in DEVICE_CATEGORIES:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    ops = {}
    for events in by_thread.values():
        events.sort(key=lambda e: (float(e.get("ts", 0.0)), -float(e.get("dur", 0.0))))
        outer, outer_end = None, -1.0
        for e in events:
            start = float(e.get("ts", 0.0))
            if start >= outer_end:
                outer, outer_end = e, start + float(e.get("dur", 0.0))
            if re.match(r"cuda[A-Z]|cu[A-Z]", e["name"]):
                continue  # a CUDA API call: its correlation ids count apart from the ops'
            args = e.get("args") or {}
            for link in (args.get("correlation"), args.get("External id")):
                if link:
                    ops[link] = (e["name"], outer["name"])
    return ops


def by_op(trace):
    """{"OUTER > OP: kernel": [us, calls]} of the device work."""
    ops = cpu_ops(trace)
    rows = collections.defaultdict(lambda: [0.0, 0])
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATEGORIES:
            continue
        args = e.get("args") or {}
        launcher = ops.get(args.get("launched_by")) or ops.get(args.get("External id"))
        if launcher is None:
            where = "(not mapped)"
        else:
            op, outer = launcher
            where = outer if op == outer else outer + " > " + op
        acc = rows[where + ": " + e["name"]]
        acc[0] += float(e.get("dur", 0.0))
        acc[1] += 1
    return rows


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=40, help="kernels listed (default 40)")
    p.add_argument("--json", metavar="FILE", help="also write the sums a step to FILE as JSON")
    p.add_argument("--by-op", action="store_true", help="also sum the device work by the op that launched it")
    args = p.parse_args(argv)
    try:
        with open(args.trace) as f:
            trace = json.load(f)
        sys.stdout.write(summarize(trace, args.top, args.trace))
        if args.by_op:
            steps = step_count(trace, args.trace)
            total, _ = step_totals(sums(trace)[1])
            sys.stdout.write("\n".join(["# by op (outermost > launching op: kernel)"] +
                                        table(by_op(trace), steps, total, args.top)) + "\n")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(per_step(trace, args.trace), f)
                f.write("\n")
    except (OSError, ValueError) as e:
        print("trace_kernels.py: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
