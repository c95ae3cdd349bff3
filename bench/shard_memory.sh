#!/usr/bin/env bash
# Per-rank model state of each --shard mode from the static memory plan
# (spmd-inspect --memory --json), beside the formula of issue 42, for the
# bench GPT (GPT-2 small, bench/models.py) at WORLD ranks. Runs on CPU: no
# GPU is needed to read the plan.
#
#   bench/shard_memory.sh [BUILD_DIR] [WORLD]     (defaults: build, 8)
#
# Prints a Markdown table: per mode, the bytes a rank holds of parameters,
# gradients (those the optimizer reads) and optimizer state, their sum per
# parameter, the formula's bytes per parameter, and the plan's peak (the
# step's transient buffers, activations included, beside the inputs).
set -euo pipefail
BUILD=${1:-build}
WORLD=${2:-8}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
python3 bench/models.py "$OUT" --model gpt > /dev/null
read -r -a INPUTS < "$OUT/gpt.inputs"
read -r -a OPTIM < "$OUT/gpt.optim"
"$BUILD/spmd-expand" "$OUT/gpt.pt" "${INPUTS[@]}" "${OPTIM[@]}" -o "$OUT/step.json"
echo "| --shard | parameters (B) | gradients (B) | optimizer state (B) | bytes / parameter | formula | plan peak (GiB) |"
echo "|---|---|---|---|---|---|---|"
for MODE in none optimizer gradients parameters; do
  FLAGS=(--world-size "$WORLD")
  [ "$MODE" != none ] && FLAGS+=(--shard "$MODE")
  "$BUILD/spmd-split" "$OUT/step.json" "${FLAGS[@]}" -o "$OUT/split.json" 2> /dev/null
  "$BUILD/spmd-inspect" "$OUT/split.json" --memory --json > "$OUT/memory.json"
  python3 - "$OUT/memory.json" "$OUT/gpt.pt" "$MODE" "$WORLD" <<'PY'
import json, sys
import torch
plan = json.load(open(sys.argv[1]))
mode, world = sys.argv[3], int(sys.argv[4])
params = sum(t.numel() for t in torch.jit.load(sys.argv[2]).parameters())
m = plan["model_state"]
total = m["parameters"] + m["gradients"] + m["optimizer_state"]
formula = {"none": "16", "optimizer": f"8 + 8/N = {8 + 8 / world:.2f}", "gradients": f"4 + 12/N = {4 + 12 / world:.2f}",
           "parameters": f"16/N = {16 / world:.2f}"}[mode]
print(f"| {mode} | {m['parameters']} | {m['gradients']} | {m['optimizer_state']} | {total / params:.2f} | {formula} | "
      f"{plan['peak_bytes'] / 2**30:.2f} |")
PY
done
