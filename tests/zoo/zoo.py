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
functional). torchvision's builders that fix a stochastic depth rate
(swin_v2_t's 0.2) get their StochasticDepth modules set to p = 0 after
construction, which makes them the identity.

PyTorch 2 as models are written today: nanogpt (Karpathy's nanoGPT: SDPA,
tied embeddings), llama (nn.RMSNorm, rotary positions, SwiGLU and
grouped-query SDPA with enable_gqa, torch >= 2.5), transformer_encoder_padding
(nn.TransformerEncoder with a key-padding mask built in forward) and
torchvision's builders (vit_b_16, swin_v2_t, efficientnet_v2_s, convnext_tiny,
resnet50) next to the hand-written attention of gpt2_hf_style and
llama_hf_style.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
try:
    import torchvision.models as tvm
    from torchvision.models import convnext, swin_transformer, vision_transformer
    from torchvision.ops import StochasticDepth
except ImportError:  # bench/models.py's gpt and llama (NanoGPT, Llama) need only torch
    tvm = None
    StochasticDepth = nn.Dropout

CLASSES = 64
VOCAB = 64


def no_dropout(model):
    for m in model.modules():
        if isinstance(m, (nn.Dropout, nn.Dropout2d, StochasticDepth)):
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


# ---- nanoGPT (Karpathy's model.py): SDPA, tied embeddings ---------------------


class NanoGPTConfig:
    """GPTConfig's fields; nanoGPT's defaults are GPT-2 small (1024, 50304, 12, 12, 768)."""

    def __init__(self, block_size=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True):
        self.block_size, self.vocab_size = block_size, vocab_size
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.dropout, self.bias = dropout, bias


class NanoLayerNorm(nn.Module):
    """nanoGPT's LayerNorm: the bias optional (bias=False drops it), eps 1e-5."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """One projection to q, k, v; flash attention through
    F.scaled_dot_product_attention(is_causal=True); the output projection."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class NanoMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class NanoBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = NanoLayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = NanoLayerNorm(config.n_embd, bias=config.bias)
        self.mlp = NanoMLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's GPT: token and learned position embeddings, pre-LN blocks, the
    final LayerNorm, lm_head tied to wte (nanoGPT assigns wte.weight =
    lm_head.weight), N(0, 0.02) weights with zero biases and the residual
    projections (c_proj) at 0.02 / sqrt(2 n_layer). forward returns (logits,
    loss), as nanoGPT's does when given targets."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([NanoBlock(config) for _ in range(config.n_layer)]),
            ln_f=NanoLayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of {t} longer than block_size {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


class NanoGPTLoss(nn.Module):
    """nanoGPT's training loop's `logits, loss = model(X, Y)`, keeping the loss."""

    def __init__(self, block_size=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, bias=True):
        super().__init__()
        self.model = NanoGPT(NanoGPTConfig(block_size, vocab_size, n_layer, n_head, n_embd, 0.0, bias))

    def forward(self, idx, targets):
        _, loss = self.model(idx, targets)
        return loss


# ---- LLaMA as written for PyTorch 2 (Meta's llama, torchtitan) ----------------


def precompute_rope(head_dim, seq, theta=10000.0):
    """cos and sin of position x frequency, [seq, head_dim / 2, 2] (the real
    form of Meta's freqs_cis, as torchtune's RotaryPositionalEmbeddings keeps it)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x, rope):
    """Rotates each adjacent pair (x[2i], x[2i+1]) of x [batch, seq, heads, head_dim]
    by its position's angle, in fp32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    rope = rope.view(1, pairs.size(1), 1, pairs.size(3), 2)
    out = torch.stack([pairs[..., 0] * rope[..., 0] - pairs[..., 1] * rope[..., 1],
                       pairs[..., 1] * rope[..., 0] + pairs[..., 0] * rope[..., 1]], dim=-1)
    return out.flatten(3).type_as(x)


class GQAttention(nn.Module):
    """Grouped-query attention: n_kv_heads key/value heads shared by n_heads query
    heads, rotary q and k, F.scaled_dot_product_attention(is_causal=True,
    enable_gqa=True) (no repeat_kv)."""

    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def init_weights(self, init_std):
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x, rope):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rope(xq, rope), apply_rope(xk, rope)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class SwiGLU(nn.Module):
    """w2(silu(w1(x)) * w3(x))."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def init_weights(self, init_std):
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, layer_id, dim, n_heads, n_kv_heads, hidden, norm_eps):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.attention = GQAttention(dim, n_heads, n_kv_heads)
        self.ffn_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.feed_forward = SwiGLU(dim, hidden)
        # torchtitan's depth-scaled init of the projections into the residual
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def init_weights(self):
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)

    def forward(self, x, rope):
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """A LLaMA-2/3-style decoder as Meta's llama and torchtitan write it for
    PyTorch 2: token embedding, pre-norm blocks (nn.RMSNorm, rotary
    grouped-query SDPA attention, SwiGLU), a final nn.RMSNorm and an untied
    output head; forward returns the logits. The hidden size is Meta's
    2/3 x 4 x dim rounded up to multiple_of unless given. torchtitan's init:
    N(0, 1) embedding, truncated normals elsewhere, the head at dim^-0.5."""

    def __init__(self, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=VOCAB, max_seq_len=16,
                 hidden=None, multiple_of=32, norm_eps=1e-5, rope_theta=10000.0):
        super().__init__()
        if hidden is None:
            hidden = int(2 * (4 * dim) / 3)
            hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.register_buffer("rope_cache", precompute_rope(dim // n_heads, max_seq_len, rope_theta))
        self.layers = nn.ModuleList(LlamaBlock(i, dim, n_heads, n_kv_heads, hidden, norm_eps) for i in range(n_layers))
        self.norm = nn.RMSNorm(dim, eps=norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()

    def init_weights(self):
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers:
            layer.init_weights()
        self.norm.reset_parameters()
        std = self.output.in_features ** -0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        rope = self.rope_cache[: tokens.size(1)]
        for layer in self.layers:
            h = layer(h, rope)
        return self.output(self.norm(h)).float()


class LlamaLoss(nn.Module):
    """torchtitan's training step: cross-entropy of the logits against labels
    (the data loader shifts them; here they are the second input)."""

    def __init__(self, **kwargs):
        super().__init__()
        self.model = Llama(**kwargs)

    def forward(self, input_ids, labels):
        logits = self.model(input_ids)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))


# ---- nn.TransformerEncoder over right-padded sequences ------------------------


class PaddedEncoderClassifier(nn.Module):
    """Sequence classification with nn.TransformerEncoder over a right-padded
    batch: forward pads each row past its length with PAD (an id outside the
    data's [0, 64), as a collate function does; a length of 0 counts as 1),
    builds src_key_padding_mask = tokens == PAD, encodes (pre-LN layers, GELU,
    enable_nested_tensor=False: the nested-tensor path is eval-only anyway)
    and classifies the mean of the unpadded positions. causal=True also passes
    a boolean causal mask (is_causal=True), the two masks merged by
    MultiheadAttention into SDPA's float mask."""

    PAD = VOCAB

    def __init__(self, dim=32, heads=4, layers=2, seq=32, causal=False):
        super().__init__()
        self.causal = causal
        self.embed = nn.Embedding(VOCAB + 1, dim, padding_idx=self.PAD)
        self.pos = nn.Embedding(seq, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens, lengths, labels):
        t = tokens.size(1)
        positions = torch.arange(t, device=tokens.device)
        tokens = tokens.masked_fill(positions[None, :] >= lengths.clamp(min=1)[:, None], self.PAD)
        padding = tokens == self.PAD
        mask = None
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
        h = self.encoder(self.embed(tokens) + self.pos(positions), mask=mask, src_key_padding_mask=padding,
                         is_causal=self.causal)
        keep = (~padding).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1)
        return F.cross_entropy(self.head(pooled), labels)


# ---- T5 as Hugging Face's transformers writes it (T5ForConditionalGeneration) ----


class T5LayerNorm(nn.Module):
    """RMS norm without a mean or a bias, its variance in fp32."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, hidden):
        variance = hidden.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.eps))


def t5_position_bucket(relative, bidirectional, buckets=32, max_distance=128):
    """T5's relative-position buckets: exact for near offsets, logarithmic for
    far ones, computed through a float log and cast back to int64 (what made
    spmd's importer give one of its constants the wrong dtype)."""
    bucket = 0
    if bidirectional:
        buckets //= 2
        bucket += (relative > 0).to(torch.long) * buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    exact = buckets // 2
    far = exact + (torch.log(relative.float() / exact) / math.log(max_distance / exact)
                   * (buckets - exact)).to(torch.long)
    far = torch.min(far, torch.full_like(far, buckets - 1))
    return bucket + torch.where(relative < exact, relative, far)


class T5Attention(nn.Module):
    """No score scaling; the first layer of a stack owns the position bias,
    which the other layers reuse."""

    def __init__(self, dim, heads, bidirectional, has_bias):
        super().__init__()
        self.heads, self.head_dim, self.bidirectional = heads, dim // heads, bidirectional
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.relative_attention_bias = nn.Embedding(32, heads) if has_bias else None

    def position_bias(self, q_len, k_len, device):
        context = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
        memory = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
        buckets = t5_position_bucket(memory - context, self.bidirectional)
        return self.relative_attention_bias(buckets).permute([2, 0, 1]).unsqueeze(0)

    def forward(self, hidden, kv=None, bias=None, mask=None):
        kv = hidden if kv is None else kv
        batch = hidden.size(0)

        def heads(x):
            return x.view(batch, -1, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(hidden)), heads(self.k(kv)), heads(self.v(kv))
        scores = torch.matmul(q, k.transpose(3, 2))
        if bias is None:
            bias = (self.position_bias(q.size(2), k.size(2), hidden.device) if self.relative_attention_bias is not None
                    else torch.zeros(1, self.heads, q.size(2), k.size(2), device=hidden.device, dtype=scores.dtype))
            if mask is not None:
                bias = bias + mask
        weights = F.softmax(scores.float() + bias, dim=-1).type_as(scores)
        out = torch.matmul(weights, v).transpose(1, 2).contiguous().view(batch, -1, self.heads * self.head_dim)
        return self.o(out), bias


class T5Block(nn.Module):
    def __init__(self, dim, heads, ff, decoder, first):
        super().__init__()
        self.norm_self = T5LayerNorm(dim)
        self.self_attn = T5Attention(dim, heads, bidirectional=not decoder, has_bias=first)
        self.cross = None
        if decoder:
            self.norm_cross = T5LayerNorm(dim)
            self.cross = T5Attention(dim, heads, bidirectional=True, has_bias=False)
        self.norm_ff = T5LayerNorm(dim)
        self.wi = nn.Linear(dim, ff, bias=False)
        self.wo = nn.Linear(ff, dim, bias=False)

    def forward(self, hidden, bias=None, mask=None, memory=None, cross_bias=None):
        out, bias = self.self_attn(self.norm_self(hidden), bias=bias, mask=mask)
        hidden = hidden + out
        if self.cross is not None:
            out, cross_bias = self.cross(self.norm_cross(hidden), kv=memory, bias=cross_bias)
            hidden = hidden + out
        hidden = hidden + self.wo(F.relu(self.wi(self.norm_ff(hidden))))
        return hidden, bias, cross_bias


class T5LM(nn.Module):
    """T5ForConditionalGeneration's training step: a shared embedding for
    both stacks and the tied head (scaled by dim ** -0.5), the decoder fed
    the labels shifted right behind the start token 0, a causal mask added to
    the decoder's position bias, and the loss over the labels."""

    def __init__(self, dim=32, heads=4, ff=64, layers=2):
        super().__init__()
        self.dim = dim
        self.shared = nn.Embedding(VOCAB, dim)
        self.encoder = nn.ModuleList(T5Block(dim, heads, ff, False, i == 0) for i in range(layers))
        self.decoder = nn.ModuleList(T5Block(dim, heads, ff, True, i == 0) for i in range(layers))
        self.encoder_norm, self.decoder_norm = T5LayerNorm(dim), T5LayerNorm(dim)

    def forward(self, input_ids, labels):
        hidden, bias = self.shared(input_ids), None
        for block in self.encoder:
            hidden, bias, _ = block(hidden, bias=bias)
        memory = self.encoder_norm(hidden)
        decoder_ids = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
        length = decoder_ids.size(1)
        causal = torch.triu(torch.full((length, length), torch.finfo(torch.float32).min, device=labels.device), 1)
        hidden, bias, cross_bias = self.shared(decoder_ids), None, None
        for block in self.decoder:
            hidden, bias, cross_bias = block(hidden, bias=bias, mask=causal[None, None], memory=memory,
                                             cross_bias=cross_bias)
        logits = F.linear(self.decoder_norm(hidden) * self.dim ** -0.5, self.shared.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


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
    "nanogpt": (NanoGPTLoss, tokens("idx", "targets", seq=16)),
    "llama": (LlamaLoss, tokens("input_ids", "labels", seq=16)),
    "transformer_encoder_padding": (PaddedEncoderClassifier,
                                    tokens("tokens", batch=4, seq=32) + ["lengths:i64[4]", "labels:i64[4]"]),
    "transformer_encoder_padding_causal": (lambda: PaddedEncoderClassifier(causal=True),
                                           tokens("tokens", batch=4, seq=32) + ["lengths:i64[4]", "labels:i64[4]"]),
    "vit_b_16": (lambda: Classify(tvm.vit_b_16(image_size=32, num_classes=CLASSES)), images(batch=2)),
    "swin_v2_t": (lambda: Classify(tvm.swin_v2_t(num_classes=CLASSES)), images(batch=2)),
    "efficientnet_v2_s": (lambda: Classify(tvm.efficientnet_v2_s(num_classes=CLASSES, stochastic_depth_prob=0.0,
                                                                 dropout=0.0)), images()),
    "convnext_tiny": (lambda: Classify(tvm.convnext_tiny(num_classes=CLASSES, stochastic_depth_prob=0.0)),
                      images(batch=2)),
    "resnet50": (lambda: Classify(tvm.resnet50(num_classes=CLASSES)), images()),
    "t5_hf_style": (T5LM, tokens("input_ids", "labels", seq=12)),
}
