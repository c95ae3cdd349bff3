#!/usr/bin/env bash
# Issue #56 on the GPU machine: spmd-train from a model.py and a train.toml to a
# bf16 run on one GPU (AdamW, warmup and cosine decay, clipping, CUDA graphs,
# a token stream, evaluation every 25 steps, checkpoints), and its last
# validation loss against eager PyTorch's model.eval() loss under autocast on
# the same weights (--save-state-dict) and batches. In one command:
#   OUT=/some/dir bash bench/gpu_train.sh         (carry .deps: bash bench/gpu_deps.sh)
# B=build-dir skips the build (B=build DEVICE=cpu AUTOCAST=cpu:bf16 runs it on the CPU).
# Writes OUT/{cmake,build}.log, OUT/work/ (the run's folder, run.json, run.err) and
# prints the comparison; exit 0 when the losses agree within 2e-2 relative.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
export PYTORCH_TENSOREXPR=0
DEVICE=${DEVICE:-cuda}
AUTOCAST=${AUTOCAST:-cuda:bf16}
if [ -z "${B:-}" ]; then
  B=$ROOT/build-gpu
  TP=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DCMAKE_PREFIX_PATH="$PWD/.deps;$TP" \
    > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
  ninja -C "$B" spmd-train spmd-run spmd-inspect > "$OUT/build.log" 2>&1 || { grep -m 20 -A5 error "$OUT/build.log"; exit 1; }
fi
B=$(cd "$B" && pwd)
W=$OUT/work
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
cat > model.py <<'PY'
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.1))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))

class TinyLM(nn.Module):
    def __init__(self, vocab=256, d=128, heads=4, layers=2, block=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

def make():
    torch.manual_seed(0)
    return TinyLM(), (torch.zeros(16, 64, dtype=torch.long), torch.zeros(16, 64, dtype=torch.long))
PY
python3 - <<'PY'
import numpy as np, torch
text = ("the quick brown fox jumps over the lazy dog. " * 4000).encode()
np.frombuffer(text, dtype=np.uint8).astype(np.uint16).tofile("train.bin")
g = torch.Generator().manual_seed(1)
starts = torch.randint(0, len(text) - 65, (4, 16), generator=g)
win = torch.tensor(list(text), dtype=torch.long)
idx = torch.stack([torch.stack([win[s:s + 64] for s in row]) for row in starts])
tgt = torch.stack([torch.stack([win[s + 1:s + 65] for s in row]) for row in starts])
torch.save({"idx": idx, "targets": tgt}, "val.pt")
PY
cat > train.toml <<TOML
[model]
module = "model.py"
[compile]
optimizer = "adamw"
lr = 1e-3
lr-schedule = "cosine"
warmup-steps = 10
decay-steps = 100
clip-grad-norm = 1.0
autocast = "$AUTOCAST"
cudagraphs = $([ "$DEVICE" = cuda ] && echo true || echo false)
[run]
device = "$DEVICE"
steps = 100
tokens = "train.bin"
eval-data = "val.pt"
eval-every = 25
eval-steps = 4
checkpoint = "ck"
checkpoint-every = 50
metrics = "metrics.jsonl"
save-state-dict = "state.pt"
json = true
TOML
start=$(date +%s.%N)
"$B/spmd-train" train.toml > run.json 2> run.err
code=$?
echo "spmd-train: exit $code in $(python3 -c "import time;print(round(time.time()-$start,1))") s (export, compile, 100 steps, 4 evaluations)"
tail -3 run.err | cut -c1-300
[ $code -eq 0 ] || exit 1
DEVICE=$DEVICE AUTOCAST=$AUTOCAST python3 - <<'PY'
import json, os, sys, torch
sys.path.insert(0, ".")
import model
run = json.loads(open("run.json").read().strip().splitlines()[-1])
device = os.environ["DEVICE"]
kind, _ = os.environ["AUTOCAST"].split(":")
net, _ = model.make()
net.load_state_dict(torch.load("state.pt"))
net = net.to(device).eval()
val = torch.load("val.pt")
with torch.no_grad(), torch.autocast(kind, dtype=torch.bfloat16):
    losses = [float(net(val["idx"][k].to(device), val["targets"][k].to(device))) for k in range(4)]
eager = sum(losses) / 4
spmd = run["val_losses"][-1][1]
print(f"losses: first {run['losses'][0]:.4f}, last {run['losses'][-1]:.4f}; val_losses {run['val_losses']}")
print(f"ms/step median {run['ms_per_step']['median']:.3f}; peak {run['peak_bytes'] / 2**20:.1f} MiB")
rel = abs(spmd - eager) / abs(eager)
print(f"last validation loss: spmd {spmd:.6f}, eager model.eval() {eager:.6f}, relative difference {rel:.2e}")
sys.exit(0 if rel <= 2e-2 else 1)
PY
