#!/usr/bin/env bash
# On the GPU machine (1 GPU): dropout's mask drawn inside the generated kernels
# (spmd-lower's dropout-mask-in-kernel) in a whole training step. A 4-layer MLP with
# dropout p = 0.1 after each ReLU (dim 1024, batch 256, bf16 autocast, AdamW)
# goes through the pipeline three ways and trains 20 steps on the same data
# and --seed:
#   fused      spmd-lower --device cuda              (the masks in the kernels)
#   graphs     spmd-lower --device cuda --cudagraphs (the same step in one CUDA graph)
#   aten       spmd-lower --device cuda --no-generated-kernels (ATen's bernoulli masks)
# fused and graphs must give the same losses bit for bit (a replayed graph
# draws the seeds an eager step draws); aten draws other masks, so its losses
# only come close. Prints the losses, the kernels and the static plans'
# peaks; writes logs to $OUT. Uses build-gpu (bench/bench.sh BUILD_ONLY=1).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
B=${B:-build-gpu}
mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import sys, torch
sys.path.insert(0, "samples")
from models import DropoutMLP
out = sys.argv[1]
torch.manual_seed(0)
torch.jit.script(DropoutMLP(dim=1024, layers=4, p=0.1).train()).save(f"{out}/dropmlp.pt")
g = torch.Generator().manual_seed(5)
torch.save({"x": torch.randn(20, 256, 1024, generator=g), "y": torch.randn(20, 256, 1, generator=g)},
           f"{out}/dropmlp.data.pt")
PY
step="$OUT/dropmlp.step"
$B/spmd-expand "$OUT/dropmlp.pt" --input "x:f32[256,1024]" --input "y:f32[256,1]" --optimizer adamw --lr 1e-3 \
  --autocast cuda:bf16 | $B/spmd-split > "$step"
for way in fused graphs aten; do
  case $way in
    fused) flags=() ;;
    graphs) flags=(--cudagraphs) ;;
    aten) flags=(--no-generated-kernels) ;;
  esac
  $B/spmd-lower "$step" --device cuda "${flags[@]}" -o "$OUT/$way.spmd" 2> "$OUT/$way.lower.log"
  $B/spmd-run "$OUT/$way.spmd" --device cuda --steps 20 --seed 3 --data "$OUT/dropmlp.data.pt" --json \
    > "$OUT/$way.json" 2> "$OUT/$way.run.log"
  echo "== $way: $(grep -c 'dropout-mask-in-kernel' "$OUT/$way.lower.log" || true) dropout-mask-in-kernel note(s)"
  grep "dropout-mask-in-kernel\|fuse-pointwise" "$OUT/$way.lower.log" || true
  $B/spmd-inspect "$OUT/$way.spmd" --memory | grep "memory plan" || true
  $B/spmd-inspect "$OUT/$way.spmd" --kernels | tail -1 || true
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
losses = {w: json.load(open(f"{out}/{w}.json"))["losses"] for w in ("fused", "graphs", "aten")}
for w, l in losses.items():
    print(f"{w:7s} " + " ".join(f"{x:.5f}" for x in l))
print("fused == graphs bit for bit:", losses["fused"] == losses["graphs"])
print(f"last loss: fused {losses['fused'][-1]:.5f}, aten {losses['aten'][-1]:.5f}")
PY
