#!/bin/bash
# temporary: one device measurement (not committed)
set -x
tp=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps;$tp" -DSPMD_TORCH_PYTHON=$(command -v python3) > $OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }
ninja -C build-gpu spmd-expand spmd-split spmd-unroll spmd-lower spmd-run spmd-inspect spmd-unit-tests > $OUT/build.log 2>&1 || { grep -B2 -A12 "error" $OUT/build.log | head -80; exit 1; }
if [ "${UNIT:-0}" = 1 ]; then build-gpu/tests/spmd-unit-tests "[cuda],[unroll]" > $OUT/unit-cuda.log 2>&1; tail -3 $OUT/unit-cuda.log; grep -B5 -A15 FAILED $OUT/unit-cuda.log | head -60
OUT=$OUT/parity bash bench/gpu_precision_parity.sh > $OUT/parity.log 2>&1; tail -6 $OUT/parity.log; fi
mkdir -p $OUT/bench
OUT=$OUT/bench WORK=$PWD/build-gpu/bench BUILD=0 MODELS=gpt PRECISIONS="${PRECISIONS:-fp32}" NPROCS=1 SYSTEMS="spmd compile" PROFILE=1 bash bench/bench.sh > $OUT/bench.log 2>&1
tail -8 $OUT/bench.log
for f in build-gpu/bench/logs/*.kernels.txt; do echo "=== $f"; head -${TOP:-45} $f; cp $f $OUT/; done
cp build-gpu/bench/logs/*.spmd.profile.txt $OUT/ 2>/dev/null
grep -h "error" build-gpu/bench/logs/*.profile.log | head
