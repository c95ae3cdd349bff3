#!/usr/bin/env bash
# Before/after on one GPU machine: bench.sh for a baseline tree (a `git archive`
# of another commit) and for this tree, in one run, so that both numbers come
# from the same card. Both trees build at once; then, in
# this tree's build, the CUDA unit tests; then each tree's bench, baseline first.
# The builds share the cores (ninja's default jobs each).
#
#   git archive <commit> -o gpu-baseline/base.tar        (here, on the CPU machine)
#   OUT=... BASE_TAR=gpu-baseline/base.tar BASE_COMMIT=<commit> SPMD_COMMIT=<this one> \
#     SYSTEMS=spmd MODELS=gpt PRECISIONS="fp32 bf16" NPROCS=1 bash bench/same_machine.sh
#
# Writes to $OUT: base.jsonl and new.jsonl (bench.sh's results.jsonl), base.log and
# new.log (bench.log), cuda_unit.log, build.log (the builds' tails on failure).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT: the folder for results}" "${BASE_TAR:?BASE_TAR: a git archive of the baseline}"
BASE=${BASE:-/tmp/spmd-baseline}
mkdir -p "$OUT" "$BASE"
tar -xf "$BASE_TAR" -C "$BASE" && cp -r .deps "$BASE/"
export COMPILE_TIME=0
build_tree() {  # DIR LOG
  (cd "$1" && BUILD_ONLY=1 OUT="$1/.build-out" bash bench/bench.sh > "$2" 2>&1)
}
build_tree "$BASE" "$OUT/base.build.log" & base_pid=$!
build_tree "$PWD" "$OUT/new.build.log"; new_rc=$?
wait $base_pid; base_rc=$?
if [ $new_rc != 0 ] || [ $base_rc != 0 ]; then
  tail -n 40 "$OUT/new.build.log" "$OUT/base.build.log" > "$OUT/build.log"; exit 1
fi
rm -f "$OUT/base.build.log" "$OUT/new.build.log"
if ninja -C build-gpu spmd-unit-tests > "$OUT/cuda_unit.log" 2>&1; then
  PYTORCH_TENSOREXPR=0 timeout 300 build-gpu/tests/spmd-unit-tests "[cuda]" >> "$OUT/cuda_unit.log" 2>&1
  echo "cuda unit tests: exit $?" >> "$OUT/cuda_unit.log"
fi
bench_tree() {  # DIR COMMIT NAME
  (cd "$1" && BUILD=0 SPMD_COMMIT=$2 OUT="$1/.bench-out" bash bench/bench.sh > /dev/null 2>&1)
  cp "$1/.bench-out/results.jsonl" "$OUT/$3.jsonl"; cp "$1/.bench-out/bench.log" "$OUT/$3.log"
}
bench_tree "$BASE" "${BASE_COMMIT:-baseline}" base
bench_tree "$PWD" "${SPMD_COMMIT:-new}" new
