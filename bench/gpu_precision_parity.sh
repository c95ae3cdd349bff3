#!/usr/bin/env bash
# On the GPU machine (1 GPU): spmd's mixed-precision and fused-attention step
# beside PyTorch's, on samples/lm.pt (5 steps of Adam, the same data).
#   spmd fp32 (fused efficient attention)   vs  DDP fp32 (math attention)
#   spmd --autocast cuda:bf16 (fused)       vs  DDP under torch.autocast bf16, math attention and SDPA
# and, as the yardstick for the bf16 differences, DDP bf16 vs DDP fp32 and
# DDP bf16 math vs DDP bf16 SDPA. Prints the largest parameter difference of
# each pair; writes the parameters to $OUT. Uses build-gpu (bench/bench.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
B=${B:-build-gpu}
mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import sys, torch
g = torch.Generator().manual_seed(5)
torch.save({"tokens": torch.randint(0, 64, (5, 4, 16), generator=g),
            "targets": torch.randint(0, 64, (5, 4, 16), generator=g)}, f"{sys.argv[1]}/lm.data.pt")
PY
spmd() {  # spmd NAME EXPAND-FLAGS...
  local name=$1; shift
  # shellcheck disable=SC2046
  $B/spmd-expand samples/lm.pt $(cat samples/lm.inputs) --optimizer adam --lr 1e-2 --eps 1e-2 "$@" | $B/spmd-split \
    | $B/spmd-lower --device cuda -o "$OUT/$name.spmd" 2> "$OUT/$name.lower.log"
  $B/spmd-run "$OUT/$name.spmd" --device cuda --steps 5 --data "$OUT/lm.data.pt" --save-params "$OUT/$name.pt" \
    > "$OUT/$name.run.log" 2>&1
}
ddp() {  # ddp NAME FLAGS...
  local name=$1; shift
  python3 bench/ddp_gpu.py --sample lm --nproc 1 --data "$OUT/lm.data.pt" --steps 5 --out "$OUT/$name.pt" "$@" \
    > "$OUT/$name.log" 2>&1
}
spmd spmd_fp32
spmd spmd_bf16 --autocast cuda:bf16
ddp ddp_fp32
ddp ddp_bf16_math --autocast
ddp ddp_bf16_sdpa --autocast --sdpa
cat "$OUT"/spmd_*.lower.log
python3 - "$OUT" <<'PY'
import sys, torch
out = sys.argv[1]
load = lambda n: torch.load(f"{out}/{n}.pt")
def diff(a, b):
    a, b = load(a), load(b)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)
for a, b in [("spmd_fp32", "ddp_fp32"), ("spmd_bf16", "ddp_bf16_math"), ("spmd_bf16", "ddp_bf16_sdpa"),
             ("ddp_bf16_math", "ddp_bf16_sdpa"), ("ddp_bf16_math", "ddp_fp32")]:
    print(f"{a} vs {b}: largest parameter difference {diff(a, b):.3g}")
PY
