#!/usr/bin/env bash
# Issue #54 on the GPU machine, in one command: builds the tools and the unit tests against
# python3's torch (build-gpu), runs the CUDA attention tests (every fused kernel, cuDNN's
# with masks included, against SDPA's math in double), then bench/bench.sh on the bf16
# transformers (MODELS, default hf_gpt2 hf_mistral) beside torch.compile's default mode
# and its CUDA graphs (SYSTEMS, default spmd compile reduce-overhead), one GPU, traces on.
#   OUT=/some/dir [MODELS=...] [SYSTEMS=...] [PRECISIONS=bf16] [BUDGET=420] [UNIT=0: no unit tests]
#     [UNIT_TAGS="[cuda]": which unit tests, default the attention ones]
#     bash bench/gpu_bf16_transformers.sh
# Writes OUT/{cmake,build,unit}.log and OUT/bench/ (bench.sh's results.jsonl,
# RESULTS-section.md, bench.log, logs.tar.gz).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
B=build-gpu
TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps;$TP" \
  -DSPMD_TORCH_PYTHON="$(command -v python3)" > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
if ! ninja -C $B spmd-expand spmd-split spmd-unroll spmd-lower spmd-run spmd-inspect spmd-unit-tests \
    > "$OUT/build.log" 2>&1; then
  grep -m 20 -A5 "error" "$OUT/build.log"
  exit 1
fi
if [ "${UNIT:-1}" = 1 ]; then
  $B/tests/spmd-unit-tests "${UNIT_TAGS:-[attention][cuda]}" > "$OUT/unit.log" 2>&1
  echo "unit tests ${UNIT_TAGS:-[attention][cuda]}: exit $? ($(grep -c attention-numerics "$OUT/unit.log") attention comparisons)"
  grep -E "cudnn .*(mask|window)" "$OUT/unit.log" | head -24
  tail -n 4 "$OUT/unit.log"
fi
OUT=$OUT/bench BUILD=0 B=$B MODELS=${MODELS:-hf_gpt2 hf_mistral} PRECISIONS=${PRECISIONS:-bf16} NPROCS=1 \
  SYSTEMS=${SYSTEMS:-spmd compile reduce-overhead} BUDGET=${BUDGET:-420} bash bench/bench.sh
