#!/usr/bin/env bash
# Compile time of one model (issues #18, #59): each stage on its own, the whole
# pipeline through pipes, spmd-compile (the four in one process), and what they are measured against, reading the
# model file and writing a copy of it once. From the repository root:
#   B=build DEVICE=cpu PYTHON=/usr/bin/python3 bash bench/compile_time.sh MODELS_DIR gpt ITERS RESULTS.jsonl
# MODELS_DIR holds bench/models.py's MODEL.pt, MODEL.inputs and MODEL.optim.
# Appends one JSON line (record.py compile-time) to RESULTS.jsonl and prints
# a summary on stderr. Every time is the median of RUNS (default 5) runs with
# the file in the page cache (one untimed read first), as a user recompiling
# meets it. Knobs: B, DEVICE, PYTHON, RUNS, EXTRA_EXPAND_FLAGS (a precision's),
# PRECISION (the record's label, default fp32),
# LOWER_FLAGS, WORK (scratch, default a temporary folder).
set -euo pipefail
if [ $# -ne 4 ]; then echo "usage: compile_time.sh MODELS_DIR MODEL ITERS RESULTS.jsonl" >&2; exit 2; fi
D=$1 M=$2 ITERS=$3 RESULTS=$4
B=${B:-build} DEVICE=${DEVICE:-cpu} PY=${PYTHON:-python3} RUNS=${RUNS:-5}
LOWER_FLAGS=${LOWER_FLAGS-} EXTRA_EXPAND_FLAGS=${EXTRA_EXPAND_FLAGS-}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
trap 'rm -f "$WORK"/ct.*' EXIT

now() { date +%s.%N; }
# timed VAR CMD...: runs CMD (a shell string), adds its wall seconds to array VAR.
timed() {
  local -n out=$1
  local t0 t1
  t0=$(now)
  bash -c "$2"
  t1=$(now)
  out+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')")
}

model=$D/$M.pt
# shellcheck disable=SC2046,SC2086  # the flag files hold several words
expand_args="$(cat "$D/$M.inputs") $(cat "$D/$M.optim") $EXTRA_EXPAND_FLAGS"
e="$B/spmd-expand $model $expand_args"
s="$B/spmd-split"
u="$B/spmd-unroll --iters $ITERS"
l="$B/spmd-lower --device $DEVICE $LOWER_FLAGS"
w=$WORK/ct

cat "$model" > /dev/null   # into the page cache
copy=() startup=() expand=() split=() unroll=() lower=() pipeline=() onep=()
for ((i = 0; i < RUNS; i++)); do
  timed copy "cat '$model' > '$w.copy'"
  rm -f "$w.copy"
  timed startup "$B/spmd-split --help > /dev/null"
  timed expand "$e -o '$w.expand.json'"
  timed split "$s '$w.expand.json' -o '$w.split.json'"
  timed unroll "$u '$w.split.json' -o '$w.unroll.json'"
  timed lower "$l '$w.unroll.json' -o '$w.spmd' 2> '$w.notes'"
  rm -f "$w.spmd"
  timed pipeline "set -o pipefail; $e | $s | $u | $l -o '$w.spmd' 2> '$w.notes'"
  rm -f "$w.spmd"
  timed onep "$B/spmd-compile $model $expand_args --iters $ITERS --device $DEVICE $LOWER_FLAGS -o '$w.spmd' 2> '$w.notes'"
  rm -f "$w.spmd"
done
"$PY" bench/record.py compile-time --model "$M" --precision "${PRECISION:-fp32}" --bytes "$(stat -c %s "$model")" --copy "${copy[@]}" \
  --startup "${startup[@]}" --stage expand "${expand[@]}" --stage split "${split[@]}" \
  --stage unroll "${unroll[@]}" --stage lower "${lower[@]}" --pipeline "${pipeline[@]}" --compile "${onep[@]}" | tee -a "$RESULTS" >&2
