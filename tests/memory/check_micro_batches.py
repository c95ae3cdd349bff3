"""Gradient accumulation keeps the step's memory at one micro-batch's:
the static memory plan (spmd-inspect --memory) of an lm step with
--micro-batches 4 must stay close to the plan of one micro-batch, and well
under the plan of one step on the four micro-batches' rows at once.

  check_micro_batches.py BIN_DIR
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def planned_peak(bin_dir, rows, micro_batches):
    inputs = [f"--input", f"tokens:i64[{rows},16]", "--input", f"targets:i64[{rows},16]"]
    step = subprocess.run([os.path.join(bin_dir, "spmd-expand"), os.path.join(ROOT, "samples", "lm.pt"), *inputs,
                           "--optimizer", "adamw", "--micro-batches", str(micro_batches)],
                          capture_output=True, check=True).stdout
    plan = subprocess.run([os.path.join(bin_dir, "spmd-inspect"), "--memory", "--json"], input=step,
                          capture_output=True, check=True).stdout
    return json.loads(plan)["peak_bytes"]


def main():
    bin_dir = sys.argv[1]
    one = planned_peak(bin_dir, 4, 1)
    accumulated = planned_peak(bin_dir, 4, 4)
    whole = planned_peak(bin_dir, 16, 1)
    print(f"planned peak: one micro-batch {one} bytes, 4 micro-batches {accumulated}, the 16 rows at once {whole}")
    # What accumulation adds: the gradient sums and the four micro-batches'
    # input rows; activations are one micro-batch's.
    if accumulated > 1.25 * one or accumulated >= 0.5 * whole:
        print("FAIL: the accumulated step's peak grows with the number of micro-batches")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
