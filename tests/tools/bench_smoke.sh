#!/usr/bin/env bash
# bench/bench.sh end to end on CPU with the tiny models (2 ranks, Gloo): the
# script, models.py, torch_step.py, allreduce.py, record.py and report.py
# must run without a failure and report every table.
#   tests/tools/bench_smoke.sh BIN_DIR PYTHON
set -euo pipefail
bin=$1 py=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! OUT=$tmp/out WORK=$tmp/work DEVICE=cpu BUILD=0 B="$bin" PYTHON="$py" TINY=1 QUICK=1 NPROCS="1 2" \
    MODELS="mlp gpt" SYSTEMS="spmd ddp" LOWER_FLAGS= RUN_FLAGS= ALLREDUCE_MB=1 PIPELINE_RUNS=1 \
    bash "$(dirname "$0")/../../bench/bench.sh" > "$tmp/log" 2>&1; then
  tail -n 40 "$tmp/log"
  echo "FAIL: bench.sh reported a failure" >&2
  exit 1
fi
report=$tmp/out/RESULTS-section.md
for want in "### mlp" "### gpt" "| 2 | spmd-run |" "| 2 | DDP eager |" "### Scaling efficiency" \
            "| mlp | spmd-run |" "### all_reduce bus bandwidth" "| 2 | 1 |" "### Targets"; do
  if ! grep -qF -- "$want" "$report"; then
    cat "$report"
    echo "FAIL: the report lacks '$want'" >&2
    exit 1
  fi
done
echo "PASS bench smoke"
