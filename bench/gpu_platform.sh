#!/usr/bin/env bash
# On the GPU machine (pip's torch with CUDA): the platform check of a LibTorch
# other than Debian's. Builds everything with the tests against pip's
# LibTorch, runs the unit tests ([cuda] cases first, so that a crash among the
# others cannot hide them), and bench/gpu_zoo.py (real transformers, timm and
# torchvision models on one GPU against eager PyTorch).
# Needs .deps (CLI11, nlohmann/json, toml++ headers: bash bench/gpu_deps.sh) where the machine lacks them.
#   OUT=dir [UNIT_ALL=0: only the [cuda] unit tests] bash bench/gpu_platform.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
export PYTORCH_TENSOREXPR=0  # the oracles' TorchScript runs unfused (tests/CMakeLists.txt says why)
TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$OUT/versions.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH="$PWD/.deps;$TP" -DSPMD_TORCH_PYTHON="$(command -v python3)" \
  > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
start=$(date +%s)
ninja -C build-gpu > "$OUT/build.log" 2>&1 || { grep -m5 -A5 "error" "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s, warnings: $(grep -c 'warning:' "$OUT/build.log")"
(cd build-gpu && ctest -R "modules.generate|exports.generate" > "$OUT/fixtures.log" 2>&1)
(cd build-gpu/tests && ./spmd-unit-tests "[cuda]" > "$OUT/unit-cuda.log" 2>&1)
echo "unit tests [cuda]: exit $?: $(tail -2 "$OUT/unit-cuda.log" | head -1)"
grep -B2 -A12 "FAILED" "$OUT/unit-cuda.log" | head -80
if [ "${UNIT_ALL:-1}" = 0 ]; then echo "unit tests but [cuda]: left out (UNIT_ALL=0)"; else
(cd build-gpu/tests && ./spmd-unit-tests "~[cuda]" > "$OUT/unit.log" 2>&1); echo "unit tests: exit $?: $(tail -2 "$OUT/unit.log" | head -1)"
grep -B2 -A8 "FAILED" "$OUT/unit.log" | head -40
if grep -q "SIGSEGV" "$OUT/unit.log" && command -v gdb > /dev/null; then  # where a crash happened
  test=$(grep -B6 "SIGSEGV" "$OUT/unit.log" | grep -m1 -A1 "^----" | tail -1)
  (cd build-gpu/tests && timeout 120 gdb -batch -ex run -ex bt --args ./spmd-unit-tests "$test" > "$OUT/crash.log" 2>&1)
  grep -A25 "SIGSEGV" "$OUT/crash.log" | head -30
fi
fi
timeout 300 python3 bench/gpu_zoo.py build-gpu "$OUT/zoo" > "$OUT/gpu_zoo.log" 2>&1; echo "gpu_zoo: exit $?"
grep -E "^(PASS|FAIL)" "$OUT/gpu_zoo.log" | cut -c1-220
rm -rf "$OUT/zoo"/*/  # models, data and artifacts: too many files to bring back
