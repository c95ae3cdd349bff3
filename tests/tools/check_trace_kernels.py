#!/usr/bin/env python3
"""bench/trace_kernels.py --by-op on two small traces written here, one in each format
it reads: spmd-run --trace's (an op's "correlation", a kernel's "launched_by") and
torch.profiler's ("External id" on both). Each kernel is tied to the op that launched it
and to the outermost op around that one; a CUDA API call whose own correlation id is the
same number as an op's does not take its kernels; a kernel tied to nothing is not mapped.
Exits 1 with the output when a line is missing."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu(name, ts, dur, link_key, link, cat="cpu"):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": "cpu", "tid": 1,
            "args": {link_key: link} if link else {}}


def kernel(name, ts, dur, link_key, link, cat="gpu"):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": "cuda:0", "tid": 7,
            "args": {link_key: link} if link else {}}


def spmd_trace():
    return {"spmd": {"steps": 1, "device": "cuda"}, "traceEvents": [
        cpu("spmd::fused_attention_backward", 0, 100, "correlation", 5),
        cpu("aten::copy_", 10, 20, "correlation", 6),
        cpu("aten::_scaled_dot_product_cudnn_attention_backward", 40, 50, "correlation", 9),
        cpu("cudaLaunchKernel", 45, 5, "correlation", 9),
        cpu("aten::mm", 200, 30, "correlation", 11),
        kernel("direct_copy_kernel", 110, 4, "launched_by", 6),
        kernel("sdpa_bprop", 120, 40, "launched_by", 9),
        kernel("gemm", 240, 10, "launched_by", 11),
        kernel("Memcpy DtoD (Device -> Device)", 260, 2, "launched_by", 0),
    ]}


def torch_trace():
    return {"spmd": {"steps": 1, "device": "cuda"}, "traceEvents": [
        cpu("aten::linear", 0, 50, "External id", 3, cat="cpu_op"),
        cpu("aten::addmm", 5, 40, "External id", 4, cat="cpu_op"),
        kernel("gemm", 60, 8, "External id", 4, cat="kernel"),
    ]}


def by_op_lines(trace):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(trace, f)
    try:
        out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "trace_kernels.py"), f.name, "--by-op"],
                             capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    return out.returncode, out.stdout + out.stderr


def main():
    failures = 0
    for trace, wanted in ((spmd_trace(), ["spmd::fused_attention_backward > aten::copy_: direct_copy_kernel",
                                          "spmd::fused_attention_backward > "
                                          "aten::_scaled_dot_product_cudnn_attention_backward: sdpa_bprop",
                                          "aten::mm: gemm", "(not mapped): Memcpy DtoD"]),
                          (torch_trace(), ["aten::linear > aten::addmm: gemm"])):
        rc, text = by_op_lines(trace)
        missing = [w for w in wanted if not any(line.split("  ")[-1].strip().startswith(w)
                                                for line in text.splitlines())]
        if rc != 0 or missing:
            failures += 1
            print("trace_kernels.py --by-op: exit %d, missing %s in:\n%s" % (rc, missing, text))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
