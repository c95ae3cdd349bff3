#!/usr/bin/env bash
# On the GPU machine (1 GPU): checkpoints and resume with a captured step.
# The lm sample with AdamW and a cosine schedule, small buckets, unrolled for
# 8 steps and lowered for CUDA with CUDA graphs: 16 steps straight; 16 steps
# with a checkpoint every 8 (each segment has 6 main iterations: the third is
# captured in the first segment and replayed in the second, after the
# cleanup and setup iterations around the checkpoint); 5 steps, then resumed
# to 16. Prints the largest parameter difference of each pair against
# the straight run (the embedding gradient's atomic adds on CUDA are not
# bit-reproducible, so a difference of rounding size is expected) and the
# step lines; files under $OUT. Uses build-gpu (bench/bench.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
B=${B:-build-gpu}
mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import sys, torch
g = torch.Generator().manual_seed(11)
torch.save({"tokens": torch.randint(0, 64, (8, 4, 16), generator=g),
            "targets": torch.randint(0, 64, (8, 4, 16), generator=g)}, f"{sys.argv[1]}/resume.data.pt")
PY
# shellcheck disable=SC2046
$B/spmd-expand samples/lm.pt $(cat samples/lm.inputs) --optimizer adamw --lr 1e-2 --eps 1e-5 --lr-schedule cosine \
    --warmup-steps 2 --decay-steps 6 --min-lr 1e-3 \
  | $B/spmd-split --bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01 | $B/spmd-unroll --iters 8 \
  | $B/spmd-lower --device cuda --cudagraphs -o "$OUT/resume.spmd" 2> "$OUT/resume.lower.log"
run() { $B/spmd-run "$OUT/resume.spmd" --device cuda --data "$OUT/resume.data.pt" "$@"; }
run --steps 16 --save-params "$OUT/straight.pt" > "$OUT/straight.log" 2>&1
run --steps 16 --checkpoint "$OUT/every" --checkpoint-every 8 --save-params "$OUT/every.pt" > "$OUT/every.log" 2>&1
run --steps 5 --checkpoint "$OUT/part" > "$OUT/part.log" 2>&1
run --steps 16 --resume "$OUT/part" --save-params "$OUT/resumed.pt" > "$OUT/resumed.log" 2>&1
for f in straight every part resumed; do echo "== $f"; cat "$OUT/$f.log"; done
python3 - "$OUT" <<'PY'
import sys, torch
out = sys.argv[1]
load = lambda n: torch.load(f"{out}/{n}.pt")
base = load("straight")
for other in ("every", "resumed"):
    x = load(other)
    d = max((x[k].double() - base[k].double()).abs().max().item() for k in base)
    print(f"{other} vs straight: largest parameter difference {d:.3g}")
PY
