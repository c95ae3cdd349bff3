#!/usr/bin/env bash
# On the GPU machine: each --shard mode's CUDA step against the unsharded one.
# The lm sample with AdamW (fused Adam on CUDA), clipping, small buckets,
# unrolled and lowered with CUDA graphs, trained 8 steps by spmd-run on NPROC
# GPUs (default: all of them; NCCL's reduce-scatter and all-gathers from 2 up;
# on 1 GPU the sharded path runs with its one-rank kernels) for --shard none,
# optimizer, gradients and parameters; prints the largest parameter difference
# of each mode against none (rounding: NCCL's sums in another order) and each
# run's last lines; then FSDP2 (bench/torch_step.py --system fsdp2) on gpt in
# its tiny form, one step, as a smoke test of that system. Files under $OUT.
# Uses build-gpu (bench/bench.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
B=${B:-build-gpu}
NPROC=${NPROC:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
mkdir -p "$OUT"
python3 - "$OUT" "$NPROC" <<'PY'
import sys, torch
g = torch.Generator().manual_seed(11)
n = int(sys.argv[2])
torch.save({"tokens": torch.randint(0, 64, (8, 4 * n, 16), generator=g),
            "targets": torch.randint(0, 64, (8, 4 * n, 16), generator=g)}, f"{sys.argv[1]}/shard.data.pt")
PY
for mode in none optimizer gradients parameters; do
  flags=(--world-size "$NPROC")
  if [ "$mode" != none ]; then flags+=(--shard "$mode"); fi
  # shellcheck disable=SC2046
  $B/spmd-expand samples/lm.pt $(cat samples/lm.inputs) --optimizer adamw --lr 1e-2 --eps 1e-5 --clip-grad-norm 0.05 \
    | $B/spmd-split --bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01 "${flags[@]}" | $B/spmd-unroll --iters 8 \
    | $B/spmd-lower --device cuda --cudagraphs -o "$OUT/$mode.spmd" 2> "$OUT/$mode.lower.log"
  $B/spmd-run "$OUT/$mode.spmd" --device cuda --nproc "$NPROC" --steps 8 --data "$OUT/shard.data.pt" \
    --save-params "$OUT/$mode.pt" > "$OUT/$mode.log" 2>&1
  echo "== $mode"; tail -n 2 "$OUT/$mode.log"
done
python3 - "$OUT" <<'PY'
import sys, torch
out = sys.argv[1]
base = torch.load(f"{out}/none.pt")
for mode in ("optimizer", "gradients", "parameters"):
    x = torch.load(f"{out}/{mode}.pt")
    d = max((x[k].double() - base[k].double()).abs().max().item() for k in base)
    print(f"--shard {mode} vs none: largest parameter difference {d:.3g}")
PY
python3 bench/torch_step.py --model gpt --tiny --system fsdp2 --nproc "$NPROC" --steps 2 --warmup 1 | tail -n 1
