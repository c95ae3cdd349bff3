#!/usr/bin/env bash
# On the GPU machine (1 GPU): the training-step features on CUDA, against the
# same artifact's CPU run (which CI checks against DDP bit for bit). The lm
# sample with AdamW, a cosine schedule after a warmup, 2 micro-batches and
# small buckets, unrolled for 8 steps: lowered for CUDA with CUDA graphs
# (fused AdamW with the tensor learning rate, also in the work unroll moved to
# the next iteration, which reads the carried rate) and for the CPU; then the
# same with the gradient norm clipped. Prints the largest parameter
# difference of each pair and each run's step lines; files under $OUT.
# Uses build-gpu (bench/bench.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
B=${B:-build-gpu}
mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import sys, torch
g = torch.Generator().manual_seed(7)
torch.save({"tokens": torch.randint(0, 64, (8, 8, 16), generator=g),
            "targets": torch.randint(0, 64, (8, 8, 16), generator=g)}, f"{sys.argv[1]}/train.data.pt")
PY
FEATURES="--lr-schedule cosine --warmup-steps 2 --decay-steps 6 --min-lr 1e-3 --micro-batches 2"
run() {  # run NAME DEVICE LOWER-FLAGS EXPAND-FLAGS...
  local name=$1 device=$2 lower=$3; shift 3
  # shellcheck disable=SC2046,SC2086
  $B/spmd-expand samples/lm.pt $(cat samples/lm.inputs) --optimizer adamw --lr 1e-2 --eps 1e-5 "$@" \
    | $B/spmd-split --bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01 | $B/spmd-unroll --iters 8 \
    | $B/spmd-lower --device "$device" $lower -o "$OUT/$name.spmd" 2> "$OUT/$name.lower.log"
  $B/spmd-run "$OUT/$name.spmd" --device "$device" --steps 8 --data "$OUT/train.data.pt" --save-params "$OUT/$name.pt" \
    > "$OUT/$name.run.log" 2>&1
}
# shellcheck disable=SC2086
run sched_cuda cuda --cudagraphs $FEATURES
# shellcheck disable=SC2086
run sched_cpu cpu "" $FEATURES
# shellcheck disable=SC2086
run clip_cuda cuda --cudagraphs $FEATURES --clip-grad-norm 0.05
# shellcheck disable=SC2086
run clip_cpu cpu "" $FEATURES --clip-grad-norm 0.05
for f in sched_cuda clip_cuda; do echo "== $f"; cat "$OUT/$f.lower.log" "$OUT/$f.run.log"; done
echo "== clip_cpu"; cat "$OUT/clip_cpu.run.log"
python3 - "$OUT" <<'PY'
import sys, torch
out = sys.argv[1]
load = lambda n: torch.load(f"{out}/{n}.pt")
for a, b in [("sched_cuda", "sched_cpu"), ("clip_cuda", "clip_cpu"), ("sched_cpu", "clip_cpu")]:
    x, y = load(a), load(b)
    d = max((x[k].double() - y[k].double()).abs().max().item() for k in y)
    r = max(((x[k].double() - y[k].double()).abs() / y[k].double().abs().clamp_min(1e-3)).max().item() for k in y)
    print(f"{a} vs {b}: largest parameter difference {d:.3g} (relative {r:.3g})")
PY
