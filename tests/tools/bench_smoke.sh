#!/usr/bin/env bash
# bench/bench.sh end to end on CPU with the tiny models (2 ranks, Gloo): the
# script, models.py, torch_step.py, allreduce.py, record.py and report.py
# must run without a failure and report every table, and spmd-run's first losses
# must be DDP eager's (both train on the same weights and batch).
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
# The oracle: PyTorch DDP's losses on the same batch, step by step.
if ! "$py" - "$tmp/out/results.jsonl" <<'EOF2'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
head = {(r["model"], r["ranks"], r["system"]): r.get("losses_head") for r in rows if r.get("kind") == "result"}
bad = 0
for (model, ranks, system), losses in sorted(head.items()):
    if system != "spmd":
        continue
    ddp = head.get((model, ranks, "ddp"))
    if not losses or not ddp or len(losses) != len(ddp) or not all(
            math.isclose(a, b, rel_tol=1e-5) for a, b in zip(losses, ddp)):
        print("FAIL: %s at %d ranks: spmd-run's first losses %s, DDP eager's %s" % (model, ranks, losses, ddp))
        bad += 1
sys.exit(1 if bad else 0)
EOF2
then
  exit 1
fi
echo "PASS bench smoke"
