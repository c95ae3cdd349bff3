#!/usr/bin/env bash
# The benchmark of issues #6, #14 and #39, on the GPU machine, from the repository root.
# Issue #39's run (models as people write them, one GPU, both precisions):
#   OUT=/some/dir MODELS="gpt llama hf_gpt2 hf_llama vit_b_16 resnet50" PRECISIONS="fp32 bf16" NPROCS=1 \
#     bash bench/bench.sh
# Issues #6 and #14's (the MLPs and gpt on 1 and 2 GPUs): OUT=/some/dir bash bench/bench.sh
# Builds spmd against python3's torch (build-gpu, as README's "Building against
# another LibTorch"), writes the models of bench/models.py (mlp, mlp4096, gpt, llama,
# hf_gpt2, hf_llama, hf_mistral, vit_b_16, resnet50, convnext_tiny; the transformers and torchvision ones need
# those packages), compiles each with spmd's pipeline once per precision, times
# spmd-run beside DDP eager, torch.compile(DDP) and torch.compile(DDP,
# mode="max-autotune-no-cudagraphs") (bench/torch_step.py) on 1 and 2 GPUs, sums the
# device time and kernels of a step from a trace of each (spmd-run --trace,
# torch.profiler; bench/trace_kernels.py), times the pipeline (for gpt also stage by
# stage beside a copy of the model file: bench/compile_time.sh; COMPILE_TIME=0 leaves
# that out), and writes to $OUT: results.jsonl (one JSON object per line),
# RESULTS-section.md (bench/report.py's markdown, to append to bench/RESULTS.md),
# bench.log (progress) and logs.tar.gz (every command's log, and each trace's kernel
# sums). Models, data, artifacts and traces (GBs) go to $WORK (default
# build-gpu/bench), so that $OUT holds few, small files. A system that fails is
# recorded as an error line (with its log's tail) and the run goes on; the exit
# status is 1 if anything failed.
#
# Time: for GPU machines lent by the 10-minute slot, on CUDA the run keeps to
# BUDGET=540 seconds, the build included (BUDGET=0: no limit; CPU runs have none).
# No command runs past it, one that would start with less than MIN_START=30 s of it
# left is skipped, and the report is still written. Each model's spmd, DDP and
# torch.compile rows come first, in MODELS order; max-autotune (which autotunes every
# GEMM) and gpt's stage-by-stage compile time come after all of them, smallest model
# first, while the budget lasts. A max-autotune run cut off by AUTOTUNE_TIMEOUT or the
# budget is recorded as skipped ("did not finish within ..."), not as a failure, and so
# is everything the budget left out. Issue #39's whole run takes more than one such
# call (torch.compile's first step alone took 24-77 s a model and precision in
# RESULTS.md's runs): split MODELS over several runs (BUILD=0 after the first, on the
# same machine) and make one report of them with
# `python3 bench/report.py OUT1/results.jsonl OUT2/results.jsonl ...`.
#
# Precisions (PRECISIONS="fp32 bf16"; default fp32): fp32 is fp32 with TF32 matmuls
# (spmd-run --tf32, torch_step.py's default); bf16 adds BF16_EXPAND_FLAGS
# (--autocast DEVICE:bf16) to spmd-expand's flags and runs torch_step.py
# --precision bf16 (torch.autocast around the forward, gpt's attention through
# F.scaled_dot_product_attention, the fused optimizer). Every result line carries
# its "precision".
#
# Knobs (environment): MODELS="mlp mlp4096 gpt" (the others too, by name),
# PRECISIONS="fp32", NPROCS="1 2", SYSTEMS="spmd ddp compile reduce-overhead max-autotune" (fsdp2
# and max-autotune-cudagraphs too on request: FSDP2's fully_shard, eager; torch.compile's
# mode="max-autotune", autotuned and replayed as CUDA graphs), DEVICE=cuda,
# PYTHON=python3, B=build-gpu (BUILD=0: use it as it is; BUILD_ONLY=1: build and stop,
# e.g. as a command of its own), TIMEOUT=180 (seconds per command;
# AUTOTUNE_TIMEOUT for max-autotune's), BUDGET, MIN_START, TRACE=1 (device time from
# traces; the default on CUDA only), QUICK=1 (5 steps + 2 warm-up), TINY=1 (the small
# models; with DEVICE=cpu BUILD=0 B=build PYTHON=/usr/bin/python3 a smoke test on CPU),
# WORK, SPMD_COMMIT (the commit the report names, for a copy of the tree whose git is
# not its own), and the flags below.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}

# ---- spmd's flags, in one place ---------------------------------------------
EXPAND_FLAGS=${EXPAND_FLAGS-}              # beside each model's --input and --optimizer flags
BF16_EXPAND_FLAGS=${BF16_EXPAND_FLAGS---autocast $DEVICE:bf16}  # beside them, for precision bf16
SPLIT_FLAGS=${SPLIT_FLAGS-}                # e.g. --bucket-cap-mb 25
UNROLL=${UNROLL-spmd-unroll}               # empty: leave the stage out; run with --iters STEPS+WARMUP
UNROLL_FLAGS=${UNROLL_FLAGS-}              # beside --iters
LOWER_FLAGS=${LOWER_FLAGS---cudagraphs}    # beside --device $DEVICE
RUN_FLAGS=${RUN_FLAGS---tf32}              # beside --nproc, --device, --steps, --warmup, --data, --json
PIPELINE_RUNS=${PIPELINE_RUNS:-3}          # timed pipeline runs for gpt (median)
# ---- PyTorch's ------------------------------------------------------------------
TORCH_FLAGS=${TORCH_FLAGS-}                # beside torch_step.py's, e.g. --cudnn-benchmark

# ---- what runs ----------------------------------------------------------------
MODELS=${MODELS:-mlp mlp4096 gpt}
PRECISIONS=${PRECISIONS:-fp32}
NPROCS=${NPROCS:-1 2}
SYSTEMS=${SYSTEMS:-spmd ddp compile reduce-overhead max-autotune}
PY=${PYTHON:-python3}
B=${B:-build-gpu}
BUILD=${BUILD:-1}
TIMEOUT=${TIMEOUT:-180}
AUTOTUNE_TIMEOUT=${AUTOTUNE_TIMEOUT:-$TIMEOUT}
if [ "$DEVICE" = cuda ]; then BUDGET=${BUDGET:-540} TRACE=${TRACE:-1}; else BUDGET=${BUDGET:-0} TRACE=${TRACE:-0}; fi
MIN_START=${MIN_START:-30}   # seconds of the budget a command needs to be started
REPORT_RESERVE=20            # seconds of the budget kept for the report and the logs' archive
TRACE_STEPS=3                # traced steps (torch_step.py's PROFILED_STEPS); spmd-run's after 2 warm-up
TINY=${TINY:-0}
# Timed steps and warm-up per model: few for hf_llama, whose steps vary little and whose
# run's time goes to start-up and compiling.
declare -A STEPS=([mlp]=300 [mlp4096]=50 [gpt]=30 [llama]=30 [hf_gpt2]=30 [hf_llama]=10 [hf_mistral]=30 [vit_b_16]=30 [resnet50]=30 [convnext_tiny]=30)
declare -A WARMUP=([mlp]=30 [mlp4096]=10 [gpt]=5 [llama]=5 [hf_gpt2]=5 [hf_llama]=3 [hf_mistral]=5 [vit_b_16]=5 [resnet50]=5 [convnext_tiny]=5)
if [ "${QUICK:-0}" = 1 ]; then
  for m in "${!STEPS[@]}"; do STEPS[$m]=5 WARMUP[$m]=2; done
fi
for m in $MODELS; do
  if [ -z "${STEPS[$m]:-}" ]; then echo "bench.sh: unknown model $m (STEPS has ${!STEPS[*]})" >&2; exit 2; fi
done
for p in $PRECISIONS; do
  case $p in fp32 | bf16) ;; *) echo "bench.sh: unknown precision $p (fp32, bf16)" >&2; exit 2 ;; esac
done
for s in $SYSTEMS; do
  case $s in spmd | ddp | fsdp2 | compile | reduce-overhead | max-autotune | max-autotune-cudagraphs) ;;
    *) echo "bench.sh: unknown system $s (spmd, ddp, fsdp2, compile, reduce-overhead, max-autotune," \
         "max-autotune-cudagraphs)" >&2; exit 2 ;;
  esac
done
TINY_FLAG=()
if [ "$TINY" = 1 ]; then TINY_FLAG=(--tiny); fi

OUT=${OUT:-$PWD/bench-out}
WORK=${WORK:-$PWD/$B/bench}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd) WORK=$(cd "$WORK" && pwd)
rm -rf "$WORK/logs" "$WORK/models" "$WORK/art" "$WORK/cache" "$WORK/traces"
mkdir -p "$WORK/logs" "$WORK/models" "$WORK/art" "$WORK/cache" "$WORK/traces"
RESULTS=$OUT/results.jsonl
: > "$RESULTS"
: > "$OUT/bench.log"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}   # NVLink multicast stays off on shared hosts
export PYTHONUNBUFFERED=1
FAILED=0

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/bench.log" >&2; }
record() { "$PY" bench/record.py "$@" >> "$RESULTS"; }
# fail SYSTEM MODEL RANKS LOG WHAT [PRECISION]: an error line, a progress line, and a failed
# run; WHAT gets the limit the command ran into, where bounded cut it off.
fail() {
  local what=$5${CUT:+ (cut off by $CUT)}
  FAILED=1
  log "FAILED: $what (log: ${4#"$WORK"/})"
  record error --system "$1" --model "$2" ${3:+--ranks "$3"} ${6:+--precision "$6"} --log "$4" --what "$what" || true
}
# skip SYSTEM MODEL RANKS PRECISION WHY: a skipped line and a progress line; the run has not failed.
skip() {
  log "SKIPPED: $1${2:+ $2}${3:+ on $3 rank(s)}${4:+ ($4)}: $5"
  record skipped --system "$1" ${2:+--model "$2"} ${3:+--ranks "$3"} ${4:+--precision "$4"} --why "$5" || true
}
has_system() { [[ " $SYSTEMS " == *" $1 "* ]]; }

# ---- the budget ------------------------------------------------------------------
CUT=""   # set by bounded: the limit its command ran into
# budget_left: the seconds a command started now may run (the report's reserve and
# timeout's grace for a kill kept back); a day without a budget.
budget_left() {
  if [ "$BUDGET" = 0 ]; then echo 86400; else echo $((BUDGET - SECONDS - REPORT_RESERVE - 10)); fi
}
# no_time_for SYSTEM MODEL RANKS PRECISION WHAT: true, with a skipped line, when too little of
# the budget is left to start WHAT.
no_time_for() {
  local left
  left=$(budget_left)
  if [ "$left" -ge "$MIN_START" ]; then return 1; fi
  skip "$1" "$2" "$3" "$4" "$5 not started: the run's budget (BUDGET=$BUDGET s) was spent"
}
# bounded SECONDS COMMAND...: COMMAND under timeout for SECONDS, or for what is left of the
# budget where that is less; returns its status and sets CUT to the limit it ran into ("" if none).
bounded() {
  local want=$1 limit left rc=0 begin=$SECONDS
  shift
  left=$(budget_left)
  limit=$((left < want ? left : want))
  if [ "$limit" -lt 1 ]; then limit=1; fi
  CUT=""
  timeout -k 10 "$limit" "$@" || rc=$?
  if [ "$rc" != 0 ] && [ $((SECONDS - begin)) -ge "$limit" ]; then
    if [ "$limit" -lt "$want" ]; then CUT="the run's budget (BUDGET=$BUDGET s)"; else CUT="the timeout ($want s)"; fi
  fi
  return "$rc"
}
# expand_flags PRECISION: what the precision adds to spmd-expand's flags.
expand_flags() { if [ "$1" = bf16 ]; then echo "$BF16_EXPAND_FLAGS"; fi; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

build() {
  local tp targets=() t
  tp=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2> "$WORK/logs/build.log") || return 1
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps;$tp" \
    -DSPMD_TORCH_PYTHON="$(command -v "$PY")" > "$WORK/logs/cmake.log" 2>&1 \
    || { cp "$WORK/logs/cmake.log" "$WORK/logs/build.log"; return 1; }
  for t in spmd-expand spmd-split spmd-unroll spmd-lower spmd-run spmd-inspect; do
    if ninja -C "$B" -t query "$t" > /dev/null 2>&1; then targets+=("$t"); else log "note: no build target $t"; fi
  done
  ninja -C "$B" "${targets[@]}" > "$WORK/logs/build.log" 2>&1
}

# pipeline MODEL ITERS ARTIFACT [FLAGS]: spmd-expand | spmd-split | [spmd-unroll] |
# spmd-lower, FLAGS (the precision's) beside EXPAND_FLAGS (exported, for timeout to
# run it in a fresh bash).
# shellcheck disable=SC2317  # reached through bash -c
pipeline() {
  set -o pipefail
  local m=$1 iters=$2 art=$3 extra=${4-} d=$WORK/models
  # shellcheck disable=SC2046,SC2086  # the flag files and variables hold several words
  $B/spmd-expand "$d/$m.pt" $(cat "$d/$m.inputs") $(cat "$d/$m.optim") $EXPAND_FLAGS $extra \
    | $B/spmd-split $SPLIT_FLAGS \
    | if [ -n "$UNROLL" ]; then $B/$UNROLL --iters "$iters" $UNROLL_FLAGS; else cat; fi \
    | $B/spmd-lower --device "$DEVICE" $LOWER_FLAGS -o "$art"
}

# art MODEL PRECISION: the artifact's path.
art() { echo "$WORK/art/$1.$2.spmd"; }

# compile_model MODEL PRECISION: the artifact for the timed runs, its wall time
# recorded (for gpt, the median of PIPELINE_RUNS runs).
compile_model() {
  local m=$1 p=$2 iters=$((STEPS[$1] + WARMUP[$1])) runs=() i t0 t1 n=1 lg=$WORK/logs/$1.$2.pipeline.log
  if [ "$m" = gpt ]; then n=$PIPELINE_RUNS; fi
  for ((i = 0; i < n; i++)); do
    t0=$(now)
    if ! bounded "$TIMEOUT" bash -c 'pipeline "$@"' pipeline "$m" "$iters" "$(art "$m" "$p")" \
        "$(expand_flags "$p")" 2> "$lg"; then
      fail spmd "$m" "" "$lg" "spmd pipeline for $m ($p)" "$p"
      return 1
    fi
    t1=$(now)
    runs+=("$(elapsed "$t0" "$t1")")
  done
  log "$m ($p): pipeline ${runs[*]} s ($(du -h "$(art "$m" "$p")" | cut -f1) artifact)"
  record pipeline --model "$m" --precision "$p" --seconds "${runs[@]}"
}

# compile_time MODEL PRECISION: bench/compile_time.sh's stage-by-stage times
# beside reading and copying the model file (issue #18).
compile_time() {
  local m=$1 p=$2 lg=$WORK/logs/$1.$2.compile_time.log
  # shellcheck disable=SC2086
  if bounded "$((TIMEOUT * 4))" env B="$B" DEVICE="$DEVICE" PYTHON="$PY" RUNS="$PIPELINE_RUNS" \
      LOWER_FLAGS="$LOWER_FLAGS" WORK="$WORK/ct" PRECISION="$p" EXTRA_EXPAND_FLAGS="$EXPAND_FLAGS $(expand_flags "$p")" \
      bash bench/compile_time.sh "$WORK/models" "$m" $((STEPS[$m] + WARMUP[$m])) "$RESULTS" 2> "$lg"; then
    log "$m ($p): compile time $(tail -n 1 "$RESULTS" | cut -c1-200)"
  else
    fail spmd "$m" "" "$lg" "bench/compile_time.sh $m ($p)" "$p"
  fi
}

SPMD_WARMUP=0
# run_spmd MODEL N PRECISION: STEPS+WARMUP steps, the first WARMUP left out of the timings;
# false if it was not run or failed.
run_spmd() {
  local m=$1 n=$2 p=$3 s=${STEPS[$1]} w=${WARMUP[$1]} tag=$1.$3.spmd.$2 warm=() excluded=()
  if [ "$SPMD_WARMUP" = 1 ]; then warm=(--warmup "$w"); excluded=(--warmup-excluded); fi
  if no_time_for spmd "$m" "$n" "$p" "spmd-run"; then return 1; fi
  # shellcheck disable=SC2086
  if bounded "$TIMEOUT" $B/spmd-run "$(art "$m" "$p")" --nproc "$n" --device "$DEVICE" $RUN_FLAGS \
      --steps $((s + w)) "${warm[@]}" --data "$WORK/models/$m.data$n.pt" --json \
      > "$WORK/logs/$tag.json" 2> "$WORK/logs/$tag.log" \
    && record spmd --model "$m" --ranks "$n" --steps "$s" --warmup "$w" "${excluded[@]}" --precision "$p" \
      --expand-flags="$(expand_flags "$p")" < "$WORK/logs/$tag.json"; then
    log "$m ($p): spmd-run, $n GPU(s): $(tail -n 1 "$RESULTS" | cut -c1-160)"
  else
    cat "$WORK/logs/$tag.json" >> "$WORK/logs/$tag.log" 2> /dev/null || true
    fail spmd "$m" "$n" "$WORK/logs/$tag.log" "spmd-run $m --nproc $n ($p)" "$p"
    return 1
  fi
}

# record_device_time SYSTEM MODEL N PRECISION TAG: bench/trace_kernels.py's sums of the trace
# WORK/traces/TAG.json as a device_time line (its table of kernels, and of the ops that
# launched them, in logs/TAG.kernels.txt); the trace, large for the big models, is removed.
record_device_time() {
  local tag=$5
  "$PY" bench/trace_kernels.py "$WORK/traces/$tag.json" --json "$WORK/logs/$tag.kernels.json" --by-op \
      --top 80 > "$WORK/logs/$tag.kernels.txt" \
    && record device-time --system "$1" --model "$2" --ranks "$3" --precision "$4" \
      --sums "$WORK/logs/$tag.kernels.json" \
    && rm -f "$WORK/traces/$tag.json"
}

# trace_spmd MODEL N PRECISION: rank 0's trace of TRACE_STEPS steps after 2 warm-up, summed as
# the row's device time; a run of its own, since the profiler's host work would slow the timed steps.
trace_spmd() {
  local m=$1 n=$2 p=$3 tag=$1.$3.spmd.$2.trace
  if no_time_for spmd "$m" "$n" "$p" "spmd-run --trace"; then return; fi
  # shellcheck disable=SC2086
  if bounded "$TIMEOUT" $B/spmd-run "$(art "$m" "$p")" --nproc "$n" --device "$DEVICE" $RUN_FLAGS \
      --steps $((TRACE_STEPS + 2)) --warmup 2 --data "$WORK/models/$m.data$n.pt" \
      --trace "$WORK/traces/$tag.json" > "$WORK/logs/$tag.log" 2>&1 \
    && record_device_time spmd "$m" "$n" "$p" "$tag" 2>> "$WORK/logs/$tag.log"; then
    log "$m ($p): spmd-run's trace, $n GPU(s): $(tail -n 1 "$RESULTS" | cut -c1-160)"
  else
    fail spmd "$m" "$n" "$WORK/logs/$tag.log" "spmd-run --trace $m --nproc $n ($p)" "$p"
  fi
}

# profile MODEL PRECISION, 1 GPU: spmd-run's per-op times (eager, synchronized) and
# torch.profiler's tables, and traces of the same steps (nothing synchronized) of spmd-run
# and of each PyTorch system in SYSTEMS, summed by kernel (bench/trace_kernels.py).
profile() {
  local m=$1 p=$2 lg=$WORK/logs/$1.$2.profile.log pre=$WORK/logs/$1.$2 sys
  if no_time_for spmd "$m" 1 "$p" "the profiles"; then return; fi
  # shellcheck disable=SC2086
  bounded "$TIMEOUT" $B/spmd-run "$(art "$m" "$p")" --device "$DEVICE" $RUN_FLAGS --steps 7 --warmup 2 \
    --data "$WORK/models/$m.data1.pt" --profile "$pre.spmd.profile.txt" > "$lg" 2>&1 \
    || fail spmd "$m" 1 "$lg" "spmd-run --profile $m ($p)" "$p"
  # The same steps traced, nothing synchronized: each kernel's own device time.
  # shellcheck disable=SC2086
  bounded "$TIMEOUT" $B/spmd-run "$(art "$m" "$p")" --device "$DEVICE" $RUN_FLAGS --steps 7 --warmup 2 \
    --data "$WORK/models/$m.data1.pt" --trace "$pre.spmd.trace.json" >> "$lg" 2>&1 \
    && "$PY" bench/trace_kernels.py "$pre.spmd.trace.json" > "$pre.spmd.kernels.txt" 2>> "$lg" \
    || fail spmd "$m" 1 "$lg" "spmd-run --trace $m ($p)" "$p"
  for sys in ddp compile; do
    has_system "$sys" || continue
    # shellcheck disable=SC2086
    bounded "$TIMEOUT" env TORCHINDUCTOR_CACHE_DIR="$WORK/cache/$m.$p.$sys.profile" \
      TRITON_CACHE_DIR="$WORK/cache/$m.$p.$sys.profile/triton" \
      "$PY" bench/torch_step.py --model "$m" --system "$sys" --nproc 1 --steps 3 --warmup 2 \
      --device "$DEVICE" --precision "$p" "${TINY_FLAG[@]}" $TORCH_FLAGS --profile "$pre.$sys.profile.txt" \
      --trace "$pre.$sys.trace.json" >> "$lg" 2>&1 \
      && "$PY" bench/trace_kernels.py "$pre.$sys.trace.json" > "$pre.$sys.kernels.txt" 2>> "$lg" \
      || fail "$sys" "$m" 1 "$lg" "torch_step.py --profile $m ($p)" "$p"
  done
  log "$m ($p): profiles and kernel sums in ${pre#"$WORK"/}.{spmd,ddp,compile}.{profile,kernels}.txt"
}

# run_torch SYSTEM MODEL N PRECISION (a fresh compile cache for each run: compile_s is a cold
# compile); with TRACE=1 torch_step.py also traces 3 steps after the timed ones, summed as the
# row's device time. max-autotune cut off by its timeout or the budget is skipped, not failed.
run_torch() {
  local sys=$1 m=$2 n=$3 p=$4 tag=$2.$4.$1.$3 limit=$TIMEOUT trace=()
  if [[ $sys == max-autotune* ]]; then limit=$AUTOTUNE_TIMEOUT; fi
  if no_time_for "$sys" "$m" "$n" "$p" "torch_step.py --system $sys"; then return; fi
  if [ "$TRACE" = 1 ]; then trace=(--trace "$WORK/traces/$tag.json"); fi
  # shellcheck disable=SC2086
  if bounded "$limit" env TORCHINDUCTOR_CACHE_DIR="$WORK/cache/$tag" TRITON_CACHE_DIR="$WORK/cache/$tag/triton" \
      "$PY" bench/torch_step.py --model "$m" --system "$sys" --nproc "$n" \
      --steps "${STEPS[$m]}" --warmup "${WARMUP[$m]}" --device "$DEVICE" --precision "$p" "${TINY_FLAG[@]}" \
      "${trace[@]}" $TORCH_FLAGS > "$WORK/logs/$tag.json" 2> "$WORK/logs/$tag.log" \
    && tail -n 1 "$WORK/logs/$tag.json" | grep -q '"kind": "result"'; then
    tail -n 1 "$WORK/logs/$tag.json" >> "$RESULTS"
    log "$m ($p): $sys, $n GPU(s): $(tail -n 1 "$RESULTS" | cut -c1-160)"
    if [ "$TRACE" = 1 ] && ! record_device_time "$sys" "$m" "$n" "$p" "$tag" 2>> "$WORK/logs/$tag.log"; then
      fail "$sys" "$m" "$n" "$WORK/logs/$tag.log" "bench/trace_kernels.py on $sys's trace of $m --nproc $n ($p)" "$p"
    fi
  elif [[ $sys == max-autotune* ]] && [ -n "$CUT" ]; then
    skip "$sys" "$m" "$n" "$p" "did not finish within $CUT"
  else
    fail "$sys" "$m" "$n" "$WORK/logs/$tag.log" "torch_step.py --system $sys --model $m --nproc $n --precision $p" "$p"
  fi
  rm -rf "$WORK/cache/$tag"   # Triton's and Inductor's files: a cold compile for every run
}

# smallest_first MODEL...: the models in the order of the parameter counts models.py recorded.
smallest_first() {
  "$PY" - "$RESULTS" "$@" << 'PYTHON'
import json, sys
params = {}
for line in open(sys.argv[1]):
    row = json.loads(line)
    if row.get("kind") == "model":
        params[row["model"]] = row["params"]
print(" ".join(sorted(sys.argv[2:], key=lambda m: params.get(m, 0))))
PYTHON
}

# record_machine: the results' first line (date, GPUs, versions, how each system ran).
record_machine() {
  local pipe comm=Gloo warmup_flag="" notes=()
  pipe="spmd-expand M.pt INPUTS OPTIMIZER $EXPAND_FLAGS | spmd-split $SPLIT_FLAGS"
  pipe+="${UNROLL:+ | $UNROLL --iters STEPS+WARMUP $UNROLL_FLAGS} | spmd-lower --device $DEVICE $LOWER_FLAGS"
  if [ "$DEVICE" = cuda ]; then comm=NCCL; fi
  if [ "$SPMD_WARMUP" = 1 ]; then warmup_flag=" --warmup WARMUP"; fi
  notes=(--note "spmd: \`$(tr -s ' ' <<< "$pipe")\`, then \`spmd-run --nproc N --device $DEVICE $RUN_FLAGS
--steps STEPS+WARMUP$warmup_flag --data\` (the batch of random inputs torch_step.py draws: models.rank_inputs)"
         --note "PyTorch: \`bench/torch_step.py\` (DDP over $comm, also for 1 GPU; inputs drawn once per rank;
each step timed between two synchronizations; torch.compile in its default mode, and as the system
max-autotune with mode=\"max-autotune-no-cudagraphs\", reduce-overhead and max-autotune-cudagraphs with
mode=\"reduce-overhead\" and mode=\"max-autotune\", CUDA graphs${TORCH_FLAGS:+; $TORCH_FLAGS})"
         --note "OPTIMIZER: each model's, the same for every system (M.optim: Adam for the MLPs, gpt and llama,
AdamW with weight decay 0.01 for hf_gpt2, hf_llama, hf_mistral and vit_b_16, SGD with momentum for resnet50)"
         --note "Peak memory: rank 0's caching-allocator peak of allocated bytes over the whole run (spmd-run's
peak_bytes; torch.cuda.max_memory_allocated after the timed steps). Compile time: spmd's pipeline (spmd-expand
to spmd-lower, wall; the model's TorchScript export is its export_s), torch.compile's first step (cold caches)")
  if [ "$TRACE" = 1 ]; then
    notes+=(--note "Device time and kernels a step: the kernels' and copies' own durations in a trace of
$TRACE_STEPS steps on rank 0 (spmd-run --trace, a run of its own after 2 warm-up steps; torch.profiler over
$TRACE_STEPS steps after the timed ones), summed by bench/trace_kernels.py; where streams overlap it exceeds the
wall time")
  fi
  if [ "$BUDGET" != 0 ]; then
    notes+=(--note "BUDGET=$BUDGET s (the build included): what would have started with less than $MIN_START s
of it left is listed as skipped; max-autotune and gpt's stage-by-stage compile time ran after every other row,
smallest model first")
  fi
  if [[ " $PRECISIONS " == *" bf16 "* ]]; then
    notes+=(--note "bf16 rows: spmd-expand also gets \`$BF16_EXPAND_FLAGS\`; PyTorch runs the forward under
torch.autocast(\"$DEVICE\", dtype=torch.bfloat16), gpt's attention as F.scaled_dot_product_attention(is_causal=True),
and the fused optimizer (torch_step.py --precision bf16); parameters, gradients and optimizer state stay fp32")
  fi
  if [ "${QUICK:-0}" = 1 ]; then notes+=(--note "QUICK=1: 5 steps after 2 warm-up"); fi
  if [ "$TINY" = 1 ]; then notes+=(--note "TINY=1: the small models of smoke tests, not a benchmark"); fi
  record machine "${notes[@]}" 2> "$WORK/logs/machine.log" \
    || fail machine "" "" "$WORK/logs/machine.log" "bench/record.py machine"
}

finish() {
  log "report"
  "$PY" bench/report.py "$RESULTS" > "$OUT/RESULTS-section.md" 2> "$WORK/logs/report.log" \
    || { FAILED=1; log "FAILED: report.py"; cat "$WORK/logs/report.log" >&2; }
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs
  cat "$OUT/RESULTS-section.md" >&2
  log "done$([ "$FAILED" = 1 ] && echo ", with failures (see results.jsonl)")"
  exit "$FAILED"
}

log "bench: models [$MODELS] in [$PRECISIONS] on [$NPROCS] $DEVICE rank(s), systems [$SYSTEMS]; out $OUT, work $WORK"

if [ "$BUILD" = 1 ]; then
  log "build ($B)"
  if ! build; then
    record_machine
    fail build "" "" "$WORK/logs/build.log" "build of the spmd tools (logs/cmake.log, logs/build.log)"
    tail -n 30 "$WORK/logs/build.log" >&2 || true
    finish
  fi
  if [ "${BUILD_ONLY:-0}" = 1 ]; then log "built; BUILD_ONLY=1: stop"; exit 0; fi
fi
# Not `--help | grep -q`: grep's early exit would fail the pipe (pipefail) on a help text it matched.
SPMD_HELP=$("$B/spmd-run" --help 2>&1 || true)
if [[ $SPMD_HELP == *--warmup* ]]; then SPMD_WARMUP=1; fi
if [ "$SPMD_WARMUP" = 0 ]; then log "note: spmd-run has no --warmup: its timings include the warm-up steps"; fi
record_machine
export -f pipeline
export WORK B DEVICE UNROLL EXPAND_FLAGS SPLIT_FLAGS UNROLL_FLAGS LOWER_FLAGS

log "models"
WRITTEN=()   # the models that models.py wrote (one that fails is left out, the others go on)
for m in $MODELS; do
  if no_time_for models "$m" "" "" "bench/models.py"; then continue; fi
  # shellcheck disable=SC2086
  if bounded "$TIMEOUT" "$PY" bench/models.py "$WORK/models" --model "$m" "${TINY_FLAG[@]}" \
      --data-ranks "$(echo $NPROCS | tr ' ' ,)" >> "$RESULTS" 2> "$WORK/logs/$m.models.log"; then
    WRITTEN+=("$m")
  else
    fail models "$m" "" "$WORK/logs/$m.models.log" "bench/models.py --model $m"
  fi
done
if [ "${#WRITTEN[@]}" = 0 ]; then finish; fi

if [ "${ALLREDUCE:-1}" = 1 ]; then
  for n in $NPROCS; do
    [ "$n" -gt 1 ] || continue
    lg=$WORK/logs/allreduce.$n.log
    if no_time_for allreduce "" "$n" "" "bench/allreduce.py"; then continue; fi
    # A second try after a failure: PyTorch's Gloo all-reduce on 2 CPU ranks has been
    # seen to hang until the timeout, where a run again alone took 3.6 s.
    ran=0
    : > "$lg"
    for attempt in 1 2; do
      if bounded "$TIMEOUT" "$PY" bench/allreduce.py --nproc "$n" --device "$DEVICE" \
          --sizes-mb "${ALLREDUCE_MB:-25,256,1024}" > "$WORK/logs/allreduce.$n.json" 2>> "$lg"; then
        ran=1
        break
      fi
      log "all_reduce, $n GPU(s): attempt $attempt failed (see $lg)"
    done
    if [ "$ran" = 1 ]; then
      grep '"kind": "allreduce"' "$WORK/logs/allreduce.$n.json" >> "$RESULTS"
      log "all_reduce, $n GPU(s): $(tail -n 1 "$WORK/logs/allreduce.$n.json" | cut -c1-160)"
    else
      fail allreduce "" "$n" "$lg" "allreduce.py --nproc $n"
    fi
  done
fi

declare -A PIPELINE_OK=()   # MODEL.PRECISION: its pipeline ran
for m in "${WRITTEN[@]}"; do
  for p in $PRECISIONS; do
    spmd_ok=0
    if has_system spmd && ! no_time_for spmd "$m" "" "$p" "the spmd pipeline"; then
      log "$m ($p): spmd pipeline"
      if compile_model "$m" "$p"; then spmd_ok=1 PIPELINE_OK[$m.$p]=1; fi
    fi
    for n in $NPROCS; do
      if [ "$spmd_ok" = 1 ] && run_spmd "$m" "$n" "$p" && [ "$TRACE" = 1 ]; then trace_spmd "$m" "$n" "$p"; fi
      if [ "$spmd_ok" = 1 ] && [ "$n" = 1 ] && [ "${PROFILE:-0}" = 1 ]; then profile "$m" "$p"; fi
      for sys in ddp fsdp2 compile reduce-overhead; do
        if has_system "$sys"; then run_torch "$sys" "$m" "$n" "$p"; fi
      done
    done
    rm -f "$(art "$m" "$p")"   # GBs for mlp4096 and hf_llama
  done
done

# The extras, after every other row and while the budget lasts: max-autotune, smallest model
# first, then gpt's compile time stage by stage (issue #18).
for sys in max-autotune max-autotune-cudagraphs; do
  has_system "$sys" || continue
  for m in $(smallest_first "${WRITTEN[@]}"); do
    for p in $PRECISIONS; do
      for n in $NPROCS; do run_torch "$sys" "$m" "$n" "$p"; done
    done
  done
done
if [ "${COMPILE_TIME:-1}" = 1 ]; then
  for p in $PRECISIONS; do
    if [ -n "${PIPELINE_OK[gpt.$p]:-}" ] && ! no_time_for spmd gpt "" "$p" "bench/compile_time.sh"; then
      compile_time gpt "$p"
    fi
  done
fi
finish
