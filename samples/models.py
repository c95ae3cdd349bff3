"""Model definitions for spmd's samples and for the tests' unseen modules.

Every model's forward returns its scalar loss, as spmd-expand expects. PyTorch 2
code: run with Debian trixie's /usr/bin/python3 (python3-torch 2.6) or later.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """The seeds' DummyModel: `layers` x (Linear(dim, dim) + ReLU), loss = sum."""

    def __init__(self, layers: int = 10, dim: int = 100):
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks.extend([nn.Linear(dim, dim), nn.ReLU()])
        self.mod = nn.Sequential(*blocks)

    def forward(self, x):
        return self.mod(x).sum()


class Attention(nn.Module):
    """Causal self-attention as nanoGPT writes it: one projection to q, k, v and
    F.scaled_dot_product_attention."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class HandWrittenAttention(Attention):
    """The same attention written out (matmul, scale, additive causal mask,
    softmax, matmul), as code before PyTorch 2 did."""

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask = torch.full([t, t], float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        probs = torch.softmax(scores + mask, dim=-1)
        y = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, approximate: str = "none", hand_written: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = (HandWrittenAttention if hand_written else Attention)(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.approximate = approximate
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate=self.approximate))


class TinyLM(nn.Module):
    """A GPT-style LM as nanoGPT and GPT-2 write it: token and position
    embeddings, pre-LN blocks with scaled dot-product attention, the head tied
    to the token embedding, cross-entropy. hand_written=True writes the
    attention out instead of calling F.scaled_dot_product_attention."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 2, layers: int = 2,
                 seq: int = 16, approximate: str = "none", hand_written: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, approximate, hand_written) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        # nanoGPT's: N(0, 0.02) weights, zero biases (the tied embedding too,
        # so the first logits are small and the loss starts near log(vocab)).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens, targets):
        t = tokens.size(1)
        positions = torch.arange(t, device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class TinyCNN(nn.Module):
    """Conv2d + BatchNorm2d (training mode) + pooling, regression head, MSE loss."""

    def __init__(self, channels: int = 3, width: int = 8, outputs: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.fc = nn.Linear(2 * width, outputs)

    def forward(self, x, y):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.adaptive_avg_pool2d(F.relu(self.bn2(self.conv2(x))), 1)
        return F.mse_loss(self.fc(torch.flatten(x, 1)), y)


class DropoutMLP(nn.Module):
    """`layers` x (Linear + ReLU + Dropout(p)) and a Linear head; loss = MSE against y
    (spmd-lower's fuse-dropout: tests/cli/check_dropout_step.py, bench/gpu_dropout.sh)."""

    def __init__(self, dim: int = 64, layers: int = 3, p: float = 0.2):
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks.extend([nn.Linear(dim, dim), nn.ReLU(), nn.Dropout(p)])
        self.mod = nn.Sequential(*blocks)
        self.head = nn.Linear(dim, 1)

    def forward(self, x, y):
        return ((self.head(self.mod(x)) - y) ** 2).mean()


# name -> (constructor, input specs in spmd's --input syntax)
SAMPLES = {
    "mlp": (lambda: MLP(), ["x:f32[100,100]"]),
    "lm": (lambda: TinyLM(), ["tokens:i64[4,16]", "targets:i64[4,16]"]),
    "cnn": (lambda: TinyCNN(), ["x:f32[8,3,16,16]", "y:f32[8,4]"]),
}
