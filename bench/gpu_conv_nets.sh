#!/usr/bin/env bash
# Issue #58 on the GPU machine, in one command: builds the tools against python3's torch
# (build-gpu), then bench/bench.sh on the convolution nets (MODELS, default resnet50
# convnext_tiny) in each precision (PRECISIONS, default fp32 bf16), once as spmd-lower lays
# them out by default (--memory-format auto: channels-last) and once with
# --memory-format contiguous (LAYOUTS, default "auto contiguous"), beside torch.compile's
# default mode and its CUDA graphs (SYSTEMS, default spmd compile reduce-overhead on the
# first layout, spmd alone on the others), one GPU, traces on.
#   OUT=/some/dir [MODELS=...] [PRECISIONS=...] [LAYOUTS=...] [SYSTEMS=...] [BUDGET=240]
#     bash bench/gpu_conv_nets.sh
# Writes OUT/{cmake,build}.log and OUT/LAYOUT/ (bench.sh's results.jsonl,
# RESULTS-section.md, bench.log, logs.tar.gz) per layout.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
B=build-gpu
TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps;$TP" \
  -DSPMD_TORCH_PYTHON="$(command -v python3)" > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
if ! ninja -C $B spmd-expand spmd-split spmd-unroll spmd-lower spmd-run spmd-inspect > "$OUT/build.log" 2>&1; then
  grep -m 20 -A5 "error" "$OUT/build.log"
  exit 1
fi
first=1
for layout in ${LAYOUTS:-auto contiguous}; do
  systems=${SYSTEMS:-spmd compile reduce-overhead}
  [ $first = 1 ] || systems=spmd
  first=0
  OUT=$OUT/$layout BUILD=0 B=$B MODELS=${MODELS:-resnet50 convnext_tiny} PRECISIONS=${PRECISIONS:-fp32 bf16} \
    NPROCS=1 SYSTEMS=$systems BUDGET=${BUDGET:-240} LOWER_FLAGS="--cudagraphs --memory-format $layout" \
    bash bench/bench.sh
done
