#!/usr/bin/env bash
# A real small run on a CPU: samples/lm.pt (a 2-layer GPT, 64 symbols,
# context 16) learns the text of the GPL version 3 that Debian ships
# (/usr/share/common-licenses/GPL-3, from base-files), read as a token stream
# (--tokens), on 2 local ranks with AdamW, a cosine schedule and clipping,
# checkpointing every 100 steps; then bench/plot_metrics.py draws its
# --metrics log (README's picture: bench/train_text.svg).
#
#   bench/train_text.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, build/train_text)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${2:-$B/train_text}
STEPS=${STEPS:-400}
TEXT=/usr/share/common-licenses/GPL-3
mkdir -p "$OUT"
rm -rf "$OUT/ckpt" "$OUT/metrics.jsonl"
# Characters to 64 symbols: a-z, 0-9, space, newline and 26 punctuation
# marks; upper case folds to lower case, anything else is symbol 63.
python3 - "$TEXT" "$OUT/train.bin" <<'PY'
import array, sys
alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 \n.,;:!?'\"()[]{}<>-_/\\@#$%&*+="
ids = {c: i for i, c in enumerate(alphabet[:63])}
text = open(sys.argv[1], encoding="utf-8").read().lower()
tokens = array.array("H", (ids.get(c, 63) for c in text))
with open(sys.argv[2], "wb") as f:
    tokens.tofile(f)
print(f"{len(tokens)} tokens of {sys.argv[1]}")
PY
"$B/spmd-expand" samples/lm.pt --input tokens:i64[16,16] --input targets:i64[16,16] --optimizer adamw --lr 3e-3 \
    --weight-decay 0.1 --betas 0.9,0.95 --lr-schedule cosine --warmup-steps 20 --decay-steps "$STEPS" --min-lr 3e-4 \
    --clip-grad-norm 1.0 \
  | "$B/spmd-split" | "$B/spmd-unroll" --iters 100 | "$B/spmd-lower" -o "$OUT/lm.spmd"
"$B/spmd-run" "$OUT/lm.spmd" --nproc 2 --steps "$STEPS" --tokens "$OUT/train.bin" --metrics "$OUT/metrics.jsonl" \
    --checkpoint "$OUT/ckpt" --checkpoint-every 100 --keep 2 | tail -3
python3 bench/plot_metrics.py "$OUT/metrics.jsonl" -o "$OUT/train_text.svg" \
    --title "samples/lm.pt on the GPL-3 text: 2 ranks, AdamW, cosine schedule, clipping ($STEPS steps)"
echo "wrote $OUT/train_text.svg; checkpoints in $OUT/ckpt"
