#!/usr/bin/env bash
# On the GPU machine: parity of all three samples with torch's DDP over NCCL
# (2 GPUs, fp32, Adam lr 1e-2 eps 1e-2, 5 steps on the same data slices).
# Uses build-gpu from bench/bench.sh where it exists (else builds the tools).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
B=build-gpu
if [ ! -x $B/spmd-run ]; then
  TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DCMAKE_PREFIX_PATH="$PWD/.deps;$TP" > "$OUT/cmake.log" 2>&1
  ninja -C $B spmd-expand spmd-split spmd-lower spmd-run > "$OUT/build.log" 2>&1
fi
python3 - "$OUT" <<'PY'
import sys, torch
out = sys.argv[1]
g = torch.Generator().manual_seed(5)
torch.save({"x": torch.randn(5, 200, 100, generator=g)}, f"{out}/mlp.data.pt")
torch.save({"tokens": torch.randint(0, 64, (5, 8, 16), generator=g),
            "targets": torch.randint(0, 64, (5, 8, 16), generator=g)}, f"{out}/lm.data.pt")
torch.save({"x": torch.randn(5, 16, 3, 16, 16, generator=g), "y": torch.randn(5, 16, 4, generator=g)}, f"{out}/cnn.data.pt")
PY
for s in mlp lm cnn; do
  $B/spmd-expand samples/$s.pt $(cat samples/$s.inputs) --optimizer adam --lr 1e-2 --eps 1e-2 | $B/spmd-split \
    | $B/spmd-lower --device cuda -o "$OUT/$s.spmd"
  $B/spmd-run "$OUT/$s.spmd" --nproc 2 --device cuda --steps 5 --data "$OUT/$s.data.pt" --save-params "$OUT/$s.ours.pt" > "$OUT/$s.run.log" 2>&1
  python3 bench/ddp_gpu.py --sample $s --nproc 2 --data "$OUT/$s.data.pt" --steps 5 --out "$OUT/$s.ref.pt" > "$OUT/$s.ddp.log" 2>&1
  python3 - "$OUT/$s.ours.pt" "$OUT/$s.ref.pt" $s <<'PY'
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
worst = max((a[k] - b[k]).abs().max().item() for k in b)
ok = all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in b)
print(f"{sys.argv[3]}: {'OK' if ok else 'MISMATCH'} ({len(b)} parameters, largest abs difference {worst:.3g})")
PY
done
