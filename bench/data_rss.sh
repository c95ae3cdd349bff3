#!/usr/bin/env bash
# Host memory of spmd-run against the size of its --data: the seeds' MLP
# (per rank x:f32[8,100]) trained for 200 steps on 1 rank from a folder holding
# x.npy of 1, 4 and 16 GB (rows [N, 100], sparse files: the size is real, the
# disk holds only the pages written), and from a torch.save dict of 1 GB for
# comparison. Prints the peak resident set size (ru_maxrss) of each run.
#
#   bench/data_rss.sh [BUILD_DIR] [WORK_DIR]      (defaults: build, build/data_rss)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
W=${2:-$B/data_rss}
mkdir -p "$W"
"$B/spmd-expand" samples/mlp.pt --input x:f32[8,100] --optimizer sgd --lr 0.01 | "$B/spmd-split" \
  | "$B/spmd-lower" -o "$W/mlp.spmd"
"${PYTHON:-/usr/bin/python3}" - "$B" "$W" <<'PY'
import os, resource, subprocess, sys
import numpy as np
b, w = sys.argv[1], sys.argv[2]

def sparse_npy(folder, gb):
    """x.npy with rows [N, 100] float32 of `gb` GiB: numpy's header, then a hole."""
    os.makedirs(folder, exist_ok=True)
    rows = gb * 2**30 // 400
    f = os.path.join(folder, "x.npy")
    with open(f, "wb") as out:
        np.lib.format.write_array_header_1_0(out, {"descr": "<f4", "fortran_order": False, "shape": (rows, 100)})
        out.truncate(out.tell() + rows * 400)
    return f

def peak_rss_mib(data):
    """ru_maxrss of one spmd-run, measured in a fresh process (the counter is a maximum over all children)."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    cmd = [f"{b}/spmd-run", f"{w}/mlp.spmd", "--steps", "200", "--device", "cpu", "--data", data]
    kib = subprocess.run([sys.executable, "-c", probe, *cmd], check=True, capture_output=True, text=True).stdout
    return int(kib) / 1024

print("| --data | file size | spmd-run peak RSS |")
print("| --- | ---: | ---: |")
for gb in (1, 4, 16):
    folder = os.path.join(w, f"npy{gb}")
    sparse_npy(folder, gb)
    print(f"| folder of .npy (mapped) | {gb} GiB | {peak_rss_mib(folder):.0f} MiB |", flush=True)
    os.remove(os.path.join(folder, "x.npy"))
import torch
dict_file = os.path.join(w, "dict1.pt")
torch.save({"x": torch.zeros(2**30 // 400, 100)}, dict_file)
print(f"| torch.save dict (read whole) | 1 GiB | {peak_rss_mib(dict_file):.0f} MiB |", flush=True)
os.remove(dict_file)
PY
