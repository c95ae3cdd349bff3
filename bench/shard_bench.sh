#!/usr/bin/env bash
# Issue 42's GPU bench: spmd-run's step time and peak memory per --shard mode on N
# GPUs, beside DDP eager and FSDP2 (fully_shard, eager), for MODELS (default gpt),
# through bench/bench.sh (one run per mode; its rows' "system" names the mode:
# "spmd shard=parameters"). Needs a machine of N GPUs (NPROCS="2", "4" or "8"; the
# step is compiled for exactly N ranks, spmd-split --world-size N).
#
#   OUT=/some/dir NPROCS=8 bash bench/shard_bench.sh
#   python3 bench/report.py /some/dir/*/results.jsonl     # one table of every mode
#
# Knobs: MODES="none optimizer gradients parameters", MODELS, PRECISIONS, NPROCS and
# the rest of bench.sh's (BUDGET applies per bench.sh run: split the modes over calls
# where a machine is lent for 10 minutes, BUILD=0 after the first).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
MODES=${MODES:-none optimizer gradients parameters}
NPROCS=${NPROCS:-2}
export MODELS=${MODELS:-gpt} COMPILE_TIME=0
build=${BUILD:-1}
status=0
for n in $NPROCS; do
  for mode in $MODES; do
    flags="--world-size $n"
    if [ "$mode" != none ]; then flags="$flags --shard $mode"; fi
    dir=$OUT/spmd.$mode.$n
    OUT=$dir SYSTEMS=spmd NPROCS=$n SPLIT_FLAGS="$flags" BUILD=$build bash bench/bench.sh || status=1
    build=0
    # The mode in the rows' system, so that one report tells them apart.
    sed -i "s/\"system\": \"spmd\"/\"system\": \"spmd shard=$mode\"/" "$dir/results.jsonl"
  done
  OUT=$OUT/torch.$n SYSTEMS="ddp fsdp2" NPROCS=$n BUILD=$build bash bench/bench.sh || status=1
  build=0
done
exit $status
