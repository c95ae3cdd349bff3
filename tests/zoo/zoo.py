"""The model zoo: models nobody on the project wrote, each wrapped so that its
forward returns the training loss, with the --input specs of one rank.

ZOO maps a name to (constructor, input specs), the shape samples/models.py's
SAMPLES has, so that tests/parity/ddp_reference.py trains them under DDP and
tests/zoo/gen_zoo.py writes their TorchScript files. Classifiers have 64
classes and LMs a vocabulary of 64: ddp_reference.py draws every int64 input
from [0, 64).

Dropout is p = 0 and stochastic depth off: parity with DDP needs the same
random masks, and spmd's random stream is not PyTorch's (README, "Dropout").
The in-place dropouts stay in-place (efficientnet's Dropout(inplace=True)
after flatten is one of the writes through views the importer makes
functional).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.models as tvm
from torchvision.models import convnext, swin_transformer, vision_transformer

CLASSES = 64
VOCAB = 64


def no_dropout(model):
    for m in model.modules():
        if isinstance(m, (nn.Dropout, nn.Dropout2d)):
            m.p = 0.0
    return model


class Classify(nn.Module):
    """cross_entropy(model(x), y)."""

    def __init__(self, model):
        super().__init__()
        self.model = no_dropout(model)

    def forward(self, x, y):
        return F.cross_entropy(self.model(x), y)


class EncoderLM(nn.Module):
    """A causal LM on torch.nn.TransformerEncoder (MultiheadAttention's baddbmm)."""

    def __init__(self, dim=32, heads=2, layers=2, seq=8):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens, targets):
        h = self.encoder(self.embed(tokens) + self.pos, mask=self.mask)
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


class Seq2Seq(nn.Module):
    """torch.nn.Transformer, encoder and decoder, with a causal target mask."""

    def __init__(self, dim=32, heads=2, seq=8):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.transformer = nn.Transformer(dim, heads, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=2 * dim, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, source, target, labels):
        h = self.transformer(self.embed(source), self.embed(target), tgt_mask=self.mask)
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


class DecoderOnly(nn.Module):
    """torch.nn.TransformerDecoder over a memory from another embedding."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.memory = nn.Embedding(VOCAB, dim)
        layer = nn.TransformerDecoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens, context, targets):
        h = self.decoder(self.embed(tokens), self.memory(context))
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


class Recurrent(nn.Module):
    """An LSTM or GRU tagger."""

    def __init__(self, cell, dim=16, hidden=24):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.rnn = cell(dim, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, tokens, targets):
        h, _ = self.rnn(self.embed(tokens))
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


# ---- GPT-2 as Hugging Face's transformers writes it ---------------------------


class Conv1D(nn.Module):
    """transformers' Conv1D: a linear layer with the weight transposed, as addmm."""

    def __init__(self, out_features, in_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) * 0.02)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(-1),)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(shape)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, dim, heads, positions):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.c_attn = Conv1D(3 * dim, dim)
        self.c_proj = Conv1D(dim, dim)
        # The float mask buffer of transformers' GPT-2 before 4.x (Gloo, which
        # DDP's buffer broadcast uses here, has no bool tensors).
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions)).view(1, 1, positions, positions))
        self.register_buffer("masked_bias", torch.tensor(-1e4))

    def split_heads(self, x):
        return x.view(x.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden):
        query, key, value = self.c_attn(hidden).split(self.heads * self.head_dim, dim=2)
        query, key, value = self.split_heads(query), self.split_heads(key), self.split_heads(value)
        weights = torch.matmul(query, key.transpose(-1, -2)) / torch.full(
            [], value.size(-1) ** 0.5, dtype=query.dtype, device=query.device)
        q_len, k_len = query.size(-2), key.size(-2)
        causal = self.bias[:, :, k_len - q_len:k_len, :k_len]
        weights = weights * causal + self.masked_bias * (1 - causal)
        weights = nn.functional.softmax(weights, dim=-1)
        out = torch.matmul(weights, value).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(out.view(out.size()[:-2] + (self.heads * self.head_dim,)))


class GPT2Block(nn.Module):
    def __init__(self, dim, heads, positions):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = GPT2Attention(dim, heads, positions)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.c_fc = Conv1D(4 * dim, dim)
        self.c_proj = Conv1D(dim, 4 * dim)

    def forward(self, hidden):
        hidden = hidden + self.attn(self.ln_1(hidden))
        return hidden + self.c_proj(gelu_new(self.c_fc(self.ln_2(hidden))))


class GPT2LMHead(nn.Module):
    """GPT2LMHeadModel's structure: tied token embedding and head, learned
    positions from torch.arange, a causal-mask buffer sliced per length, and
    the shifted-label loss."""

    def __init__(self, dim=32, heads=2, layers=2, positions=16):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, dim)
        self.wpe = nn.Embedding(positions, dim)
        self.h = nn.ModuleList(GPT2Block(dim, heads, positions) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, labels):
        position_ids = torch.arange(0, input_ids.size(-1), dtype=torch.long, device=input_ids.device).unsqueeze(0)
        hidden = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            hidden = block(hidden)
        logits = self.lm_head(self.ln_f(hidden))
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        return F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


# ---- LLaMA as Hugging Face's transformers writes it (eager attention) ----------


class LlamaRMSNorm(nn.Module):
    """Root-mean-square norm in fp32, as LlamaRMSNorm computes it."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, hidden):
        dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        return self.weight * hidden.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    """Rotary positions, grouped-query heads and a softmax over fp32 scores."""

    def __init__(self, dim, heads, kv_heads, seq):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def forward(self, hidden):
        batch, seq, _ = hidden.shape
        q = self.q_proj(hidden).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:seq], self.sin[:seq]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + self.mask[:seq, :seq]
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLM(nn.Module):
    """LlamaForCausalLM's structure: pre-norm blocks of RMSNorm, rotary
    attention and a SwiGLU MLP, an untied head, the shifted-label loss."""

    def __init__(self, dim=32, heads=4, kv_heads=2, layers=2, seq=8, vocab=VOCAB, hidden=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            block = nn.ModuleDict({"input_layernorm": LlamaRMSNorm(dim),
                                   "self_attn": LlamaAttention(dim, heads, kv_heads, seq),
                                   "post_attention_layernorm": LlamaRMSNorm(dim),
                                   "mlp": LlamaMLP(dim, hidden or 3 * dim)})
            self.layers.append(block)
        self.norm = LlamaRMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, labels):
        hidden = self.embed_tokens(input_ids)
        for block in self.layers:
            hidden = hidden + block["self_attn"](block["input_layernorm"](hidden))
            hidden = hidden + block["mlp"](block["post_attention_layernorm"](hidden))
        logits = self.lm_head(self.norm(hidden))
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        return F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def images(batch=4, size=32):
    return [f"x:f32[{batch},3,{size},{size}]", f"y:i64[{batch}]"]


def tokens(*names, batch=2, seq=8):
    return [f"{n}:i64[{batch},{seq}]" for n in names]


ZOO = {
    "resnet18": (lambda: Classify(tvm.resnet18(num_classes=CLASSES)), images()),
    "mobilenet_v2": (lambda: Classify(tvm.mobilenet_v2(num_classes=CLASSES)), images()),
    "mobilenet_v3_small": (lambda: Classify(tvm.mobilenet_v3_small(num_classes=CLASSES)), images()),
    "efficientnet_b0": (lambda: Classify(tvm.efficientnet_b0(num_classes=CLASSES, stochastic_depth_prob=0.0)),
                        images()),
    "shufflenet_v2": (lambda: Classify(tvm.shufflenet_v2_x0_5(num_classes=CLASSES)), images()),
    "squeezenet": (lambda: Classify(tvm.squeezenet1_1(num_classes=CLASSES)), images(size=48)),
    "densenet121": (lambda: Classify(tvm.densenet121(num_classes=CLASSES)), images()),
    "regnet": (lambda: Classify(tvm.regnet_y_400mf(num_classes=CLASSES)), images()),
    "vit": (lambda: Classify(vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=CLASSES)),
        images(batch=2)),
    "convnext": (lambda: Classify(convnext.ConvNeXt(
        [convnext.CNBlockConfig(16, 32, 1), convnext.CNBlockConfig(32, None, 1)], num_classes=CLASSES)),
        images(batch=2)),
    "swin": (lambda: Classify(swin_transformer.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
        stochastic_depth_prob=0.0, num_classes=CLASSES)), images(batch=2)),
    "transformer_encoder_lm": (EncoderLM, tokens("tokens", "targets")),
    "transformer_seq2seq": (Seq2Seq, tokens("source", "target", "labels")),
    "transformer_decoder": (DecoderOnly, tokens("tokens", "context", "targets")),
    "lstm": (lambda: Recurrent(nn.LSTM), tokens("tokens", "targets")),
    "gru": (lambda: Recurrent(nn.GRU), tokens("tokens", "targets")),
    "gpt2_hf_style": (GPT2LMHead, tokens("input_ids", "labels", seq=16)),
    "llama_hf_style": (LlamaLM, tokens("input_ids", "labels")),
}
