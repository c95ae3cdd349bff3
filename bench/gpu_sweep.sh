#!/usr/bin/env bash
# Issue #55 on the GPU machine, in one command: builds the tools and the unit
# tests against python3's torch (build-gpu), runs the generated-kernel tests on
# the GPU ([fused][cuda]: every fused kernel against ATen's, results laid out
# as ATen lays them out), then bench/sweep.py on the GPU: torchvision's
# families, timm's and transformers' architectures (TIER, default families),
# JOBS models at once (default 8), each model's files for at most TIMEOUT s,
# no model started after DEADLINE - TIMEOUT s from the script's start (the
# rest listed as not run; DEADLINE default 560, under the device's 600).
#   OUT=/some/dir [TIER=families|all] [JOBS=8] [TIMEOUT=150] [DEADLINE=560] [ONLY="NAME ..."]
#     [SWEEP_LIBRARIES="torchvision timm transformers"] (not LIBRARIES: nvcc reads that)
#     bash bench/gpu_sweep.sh
# Writes OUT/{cmake,build,unit}.log, OUT/sweep.log, OUT/sweep.md and
# OUT/sweep.json (the models' folders are left on the machine).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
export PYTORCH_TENSOREXPR=0
B=build-gpu
TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
start=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps;$TP" \
  -DSPMD_TORCH_PYTHON="$(command -v python3)" > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
if ! ninja -C $B spmd-expand spmd-split spmd-unroll spmd-lower spmd-run spmd-inspect spmd-unit-tests \
    > "$OUT/build.log" 2>&1; then
  grep -m 20 -A5 "error" "$OUT/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
$B/tests/spmd-unit-tests "[fused][cuda]" > "$OUT/unit.log" 2>&1
echo "generated-kernel tests on the GPU: exit $?"
grep -E "permuted|FAILED" -A3 "$OUT/unit.log" | head -30
tail -n 3 "$OUT/unit.log"
only=()
for name in ${ONLY:-}; do only+=(--only "$name"); done
for lib in ${SWEEP_LIBRARIES:-}; do only+=(--library "$lib"); done
SPMD_COMMIT=${SPMD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)} \
  python3 bench/sweep.py $B "$OUT/sweep" --device cuda --tier "${TIER:-families}" --jobs "${JOBS:-8}" \
  --timeout "${TIMEOUT:-150}" --budget $(( ${DEADLINE:-560} - ($(date +%s) - start) - ${TIMEOUT:-150} )) \
  "${only[@]}" > "$OUT/sweep.log" 2>&1
echo "sweep: exit $?"
cp "$OUT/sweep/sweep.md" "$OUT/sweep/sweep.json" "$OUT/" 2>/dev/null
rm -rf "$OUT/sweep"
grep -vE "^trains " "$OUT/sweep.log" | cut -c1-300 | tail -60
