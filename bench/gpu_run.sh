#!/usr/bin/env bash
# On the GPU machine (see README): builds spmd against pip torch with CUDA,
# checks parity of the seeds' MLP with DDP over NCCL on 2 GPUs, and times
# spmd-run beside DDP eager and torch.compile(DDP). Writes logs to $OUT (or ./bench-out).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/.deps;$TP" -DSPMD_TORCH_PYTHON="$(command -v python3)" > "$OUT/cmake.log" 2>&1
ninja -C build-gpu > "$OUT/build.log" 2>&1
B=build-gpu
# The unit tests that need no Python oracle, against this LibTorch (derivative
# rules incl. scaled_dot_product_attention, buckets, expand vs torch::optim).
$B/tests/spmd-unit-tests "[autodiff],[bucket],[expand]" > "$OUT/unit.log" 2>&1 || true
tail -n 3 "$OUT/unit.log"
NPROC=${NPROC:-2}
# A data file in spmd-run's layout: 5 slices of the global batch (100 rows per rank).
python3 -c "import torch; torch.manual_seed(3); torch.save({'x': torch.randn(5, 100*$NPROC, 100)}, '$OUT/data.pt')"
$B/spmd-expand samples/mlp.pt $(cat samples/mlp.inputs) --optimizer adam --lr 1e-2 --eps 1e-2 | $B/spmd-split \
  | $B/spmd-lower --device cuda -o "$OUT/parity.spmd"
$B/spmd-expand samples/mlp.pt $(cat samples/mlp.inputs) --optimizer adam --lr 1e-2 | $B/spmd-split \
  | $B/spmd-lower --device cuda -o "$OUT/mlp.spmd"
$B/spmd-run "$OUT/parity.spmd" --nproc $NPROC --device cuda --steps 5 --data "$OUT/data.pt" --save-params "$OUT/ours.pt" > "$OUT/parity-run.log" 2>&1
python3 bench/ddp_gpu.py --nproc $NPROC --data "$OUT/data.pt" --steps 5 --out "$OUT/ref.pt" > "$OUT/parity-ddp.log" 2>&1
python3 -c "
import torch
a, b = torch.load('$OUT/ours.pt'), torch.load('$OUT/ref.pt')
worst = max(((a[k]-b[k]).abs() / (b[k].abs() + 1e-6)).max().item() for k in b)
ok = all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in b)
print('parity', 'OK' if ok else 'MISMATCH', 'worst relative diff %.3g' % worst)
" | tee "$OUT/parity.txt"
# Timing: the seeds' MLP, batch 100 per rank, Adam, TF32.
$B/spmd-run "$OUT/mlp.spmd" --nproc $NPROC --device cuda --tf32 --steps 220 --json > "$OUT/spmd.json" 2> "$OUT/spmd.err"
python3 bench/ddp_gpu.py --nproc $NPROC --time 200 --warmup 20 > "$OUT/ddp.json" 2> "$OUT/ddp.err"
python3 bench/ddp_gpu.py --nproc $NPROC --time 200 --warmup 20 --compile > "$OUT/compile.json" 2> "$OUT/compile.err" || true
cat "$OUT/spmd.json" "$OUT/ddp.json" "$OUT/compile.json"
