"""Generates TorchScript modules that spmd's importer has never seen, with their PyTorch outputs.

Usage: /usr/bin/python3 tests/modules/gen_modules.py OUTDIR

Writes into OUTDIR:
  NAME.pt            a module saved with torch.jit.save (scripted or traced);
  NAME.expected.pt   torch.save'd {"inputs": {arg: tensor}, "outputs": [tensor, ...],
                     "buffers": {name: tensor}}: random inputs, what forward returned
                     (flattened) and the buffers after that forward, from a fresh
                     torch.jit.load of NAME.pt called once in train mode;
  manifest.json      one entry per module: name, file, inputs (spmd --input specs),
                     parameters and buffers (as named_parameters() / named_buffers()
                     list them), frozen (parameters with requires_grad=False), expected;
  errors.json        modules or input specs spmd must reject: name, file, inputs, the
                     message substring and the user's source line ("gen_modules.py:N")
                     the error must name, or null.

Every module's forward returns its scalar loss, or a tuple whose first element is
the loss. Each module is built and fed under its own torch.manual_seed, so the
output does not depend on which other modules exist or in what order.
"""
import inspect
import json
import math
import os
import sys
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

THIS_FILE = os.path.basename(__file__)


# ---- MLPs -------------------------------------------------------------------


def linear_stack(widths, activation, biases=None):
    """Linear layers widths[0] -> widths[1] -> ... with `activation()` between them."""
    biases = biases or [True] * (len(widths) - 1)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(n_in, n_out, bias=biases[i]))
        if i < len(widths) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class ReducedMLP(nn.Module):
    """An MLP whose loss is the sum or the mean of its output."""

    def __init__(self, widths, activation, reduction, biases=None):
        super().__init__()
        self.body = linear_stack(widths, activation, biases)
        self.reduction = reduction

    def forward(self, x):
        out = self.body(x)
        if self.reduction == "sum":  # a branch on a str attribute
            return out.sum()
        return out.mean()


class RegressionMLP(nn.Module):
    """An MLP regressing onto `y` with MSE."""

    def __init__(self, widths, activation, biases=None):
        super().__init__()
        self.body = linear_stack(widths, activation, biases)

    def forward(self, x, y):
        return F.mse_loss(self.body(x), y)


class FrozenMLP(nn.Module):
    """Some parameters have requires_grad=False but are still parameters."""

    def __init__(self, dim_in, hidden, dim_out):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, dim_in), requires_grad=False)
        self.fc1 = nn.Linear(dim_in, hidden)
        self.fc2 = nn.Linear(hidden, dim_out)
        self.fc1.bias.requires_grad_(False)

    def forward(self, x, y):
        h = F.silu(self.fc1(x * self.scale))
        return F.mse_loss(self.fc2(h), y, reduction="sum")


class GatedMLP(nn.Module):
    """Control flow on a module attribute and on shapes, which tracing resolves statically."""

    def __init__(self, dim, hidden, use_residual: bool):
        super().__init__()
        self.use_residual = use_residual
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, hidden)

    def forward(self, x):
        if x.dim() == 3:  # (batch, time, dim) -> (batch * time, dim)
            x = x.flatten(0, 1)
        h = torch.tanh(self.fc1(self.norm(x)))
        if self.use_residual:
            h = h + x
        if x.size(-1) > 8:
            h = F.silu(self.fc2(h))
        else:
            h = torch.sigmoid(self.fc2(h))
        return h.pow(2).mean()


# ---- language models ----------------------------------------------------------


class SelfAttention(nn.Module):
    """Multi-head attention from matmul and softmax, optionally causal.

    The score scale is a float attribute, or with scale_buffer a 0-dim
    non-persistent buffer (torch.jit.trace records `tensor * float` with the
    float as a tensor constant; a buffer avoids that).
    """

    def __init__(self, dim, heads, causal: bool, scale_buffer: bool):
        super().__init__()
        self.heads = heads
        scale = 1.0 / math.sqrt(dim // heads)
        if scale_buffer:
            self.register_buffer("scale", torch.tensor(scale), persistent=False)
        else:
            self.scale = scale
        self.causal = causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # (b, t, c) -> (b, heads, t, d)
        q = q.reshape(b, t, self.heads, d).permute(0, 2, 1, 3)
        k = k.reshape(b, t, self.heads, d).permute(0, 2, 1, 3)
        v = v.reshape(b, t, self.heads, d).permute(0, 2, 1, 3)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if self.causal:
            keep = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(keep.logical_not(), float("-inf"))
        probs = self.drop(F.softmax(scores, dim=-1))
        y = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, t, c)
        return self.out(y)


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, causal: bool, approximate: str, scale_buffer: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal, scale_buffer)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.approximate = approximate

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = F.gelu(self.up(self.norm2(x)), approximate=self.approximate)
        return x + F.dropout(self.down(h), p=0.0, training=self.training)


class LanguageModel(nn.Module):
    """Token + position embeddings, transformer blocks, a vocabulary head.

    loss: "ce" (F.cross_entropy with `ignore_index` and `reduction`) or "nll"
    (log_softmax + nll_loss). With tie_weights the head shares the token
    embedding's weight. forward returns (loss, logits). scale_buffer: see SelfAttention.
    """

    def __init__(self, vocab, dim, heads, layers, seq, causal=True, approximate="none",
                 tie_weights=False, loss="ce", ignore_index=-100, reduction="mean",
                 scale_buffer=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([TransformerBlock(dim, heads, causal, approximate, scale_buffer)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie_weights:
            self.head.weight = self.tok.weight
        self.loss = loss
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        flat = logits.reshape(-1, logits.size(-1))
        if self.loss == "ce":
            loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=self.ignore_index,
                                   reduction=self.reduction)
        else:
            loss = F.nll_loss(F.log_softmax(flat, dim=-1), targets.reshape(-1),
                              ignore_index=self.ignore_index, reduction=self.reduction)
        return loss, logits


class LossOnly(nn.Module):
    """Wraps a module returning (loss, extra) so that forward returns the loss alone."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, tokens, targets):
        return self.inner(tokens, targets)[0]


# ---- CNNs -------------------------------------------------------------------


class StridedCNN(nn.Module):
    """Strided and padded convolutions, BatchNorm2d, max pooling, MSE regression."""

    def __init__(self, channels, width, outputs):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, (3, 2), padding=(1, 0), bias=False)
        self.bn2 = nn.BatchNorm2d(2 * width, momentum=0.3)
        self.fc = nn.Linear(2 * width, outputs)

    def forward(self, x, y):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.adaptive_avg_pool2d(F.relu(self.bn2(self.conv2(x))), 1)
        return F.mse_loss(self.fc(torch.flatten(x, 1)), y)


class GroupedCNN(nn.Module):
    """Grouped convolutions and avg_pool2d; loss = mean of squares."""

    def __init__(self, channels, width):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=2, groups=2)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 1, groups=4, bias=False)
        self.bn2 = nn.BatchNorm2d(width, affine=False)
        self.fc = nn.Linear(width * 3 * 3, 5)

    def forward(self, x):
        x = F.avg_pool2d(torch.tanh(self.bn1(self.conv1(x))), 2)
        x = F.avg_pool2d(self.bn2(self.conv2(x)), kernel_size=3, stride=2, padding=1)
        return self.fc(x.flatten(1)).pow(2).mean()


class DepthwiseClassifier(nn.Module):
    """Depthwise + pointwise convolutions, overlapping max pooling, cross-entropy."""

    def __init__(self, channels, width, classes):
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, width, 1)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width * 2 * 2, classes)

    def forward(self, x, labels):
        x = F.relu(self.pointwise(self.depthwise(x)))
        x = F.max_pool2d(self.bn(x), kernel_size=3, stride=2, padding=1)
        x = F.adaptive_avg_pool2d(x, (2, 2))
        return F.cross_entropy(self.fc(torch.flatten(x, 1)), labels)


class ResidualConvBlock(nn.Module):
    def __init__(self, width, use_residual: bool):
        super().__init__()
        self.use_residual = use_residual
        self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x):
        h = self.bn(self.conv(x))
        if self.use_residual:
            h = h + x
        return F.relu(h)


class TinyResNet(nn.Module):
    """Residual blocks switched by attributes, and pooling chosen by the input's size."""

    def __init__(self, channels, width, outputs):
        super().__init__()
        self.stem = nn.Conv2d(channels, width, 3, padding=1)
        self.blocks = nn.ModuleList(
            [ResidualConvBlock(width, True), ResidualConvBlock(width, False)])
        self.fc = nn.Linear(width, outputs)

    def forward(self, x, y):
        x = self.stem(x)
        if x.size(-1) > 8:
            x = F.max_pool2d(x, 2)
        for block in self.blocks:
            x = block(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.mse_loss(self.fc(x), y)


# ---- modules spmd must reject ----------------------------------------------------


class DataDependentBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            h = h * 2.0
        return h.sum()


# ---- in-place writes through views (functionalized on import) -------------


class InPlaceOnSelect(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        h = self.fc(x)
        h[:, 0].add_(1.0)
        return h.sum()


class InPlaceOnView(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        h = self.fc(x)
        h.view(-1).mul_(2.0)
        return h.mean()


class InPlaceViewsOfViews(nn.Module):
    """A view taken before a write reads the written values; slices assigned
    into; in-place activations and dropout on flatten/transpose results
    (efficientnet's Dropout(inplace=True) after flatten)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(p=0.0, inplace=True)

    def forward(self, x):
        h = self.fc(x)
        first = h[0]
        h.transpose(0, 1)[1:3].mul_(3.0)
        h[:, 4] = first[:1] * 0.5
        flat = torch.flatten(h, 1)
        flat.relu_()
        self.drop(flat)
        return h.sum() + first.sum() * 2.0


class IndexGather(nn.Module):
    """aten::index with tensor indices (Tensor?[] with absent entries): the
    rows and columns a GPT-2 head gathers."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("pick", torch.tensor([0, 2, 2, 5]))

    def forward(self, x):
        h = self.fc(x)
        rows = h[torch.arange(h.size(0)), self.pick[: h.size(0)]]
        cols = h[:, self.pick]
        return rows.sum() + (cols * cols).sum()


class IndexConstant(nn.Module):
    """Indexing with Python lists, as Falcon's multi-query attention splits
    its fused q/k/v (`fused[..., [-2], :]`): traced, each list becomes a
    tensor constant (a 2-D one here too)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)

    def forward(self, x):
        h = self.fc(x).view(x.size(0), 4, 2)
        key = h[..., [-2], :]
        grid = h[:, torch.tensor([[0, 3], [1, 1]])]
        return (key * key).sum() + grid.sum() * 0.5


# ---- inputs -----------------------------------------------------------------


class Arg:
    """One forward argument: its --input spec and how to draw a valid random value.

    Floating arguments are randn. Integer ones are indices or targets in
    [0, high); with `ignore` set, about a quarter of them are that ignore_index.
    """

    DTYPES = {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64}

    def __init__(self, name, dtype, shape, high=None, ignore=None):
        self.name, self.dtype, self.shape = name, dtype, list(shape)
        self.high, self.ignore = high, ignore

    def spec(self):
        return "%s:%s[%s]" % (self.name, self.dtype, ",".join(str(d) for d in self.shape))

    def sample(self):
        dtype = self.DTYPES[self.dtype]
        if dtype.is_floating_point:
            return torch.randn(self.shape, dtype=dtype)
        value = torch.randint(0, self.high, self.shape, dtype=dtype)
        if self.ignore is not None:
            value = torch.where(torch.rand(self.shape) < 0.25,
                                torch.full_like(value, self.ignore), value)
        return value


def f32(name, *shape):
    return Arg(name, "f32", shape)


def i64(name, shape, high, ignore=None):
    return Arg(name, "i64", shape, high, ignore)


# ---- the modules --------------------------------------------------------------

# (name, "script" | "trace", constructor, forward arguments in order)
MODULES = [
    ("mlp_relu_sum", "script",
     lambda: ReducedMLP([7, 13, 13, 5], nn.ReLU, "sum"), [f32("x", 4, 7)]),
    ("mlp_tanh_mean", "trace",
     lambda: ReducedMLP([16, 32, 32, 8], nn.Tanh, "mean", biases=[True, False, True]),
     [f32("x", 3, 16)]),
    ("mlp_sigmoid_mse", "script",
     lambda: RegressionMLP([10, 24, 3], nn.Sigmoid, biases=[False, False]),
     [f32("x", 6, 10), f32("y", 6, 3)]),
    ("mlp_silu_deep", "trace",
     lambda: ReducedMLP([3, 11, 11, 11, 11, 11, 2], nn.SiLU, "sum"), [f32("x", 5, 3)]),
    ("mlp_batched_3d", "script",
     lambda: RegressionMLP([9, 17, 4], nn.ReLU), [f32("x", 2, 5, 9), f32("y", 2, 5, 4)]),
    ("mlp_frozen", "script",
     lambda: FrozenMLP(8, 12, 3), [f32("x", 4, 8), f32("y", 4, 3)]),
    ("gated_residual_3d", "script",
     lambda: GatedMLP(12, 6, use_residual=True), [f32("x", 2, 5, 12)]),
    ("gated_plain_2d", "script",
     lambda: GatedMLP(6, 4, use_residual=False), [f32("x", 7, 6)]),
    ("lm_causal", "script",
     lambda: LossOnly(LanguageModel(vocab=50, dim=24, heads=3, layers=2, seq=10)),
     [i64("tokens", [3, 10], 50), i64("targets", [3, 10], 50)]),
    ("lm_tied_tanh_sum", "script",
     lambda: LossOnly(LanguageModel(vocab=31, dim=16, heads=2, layers=1, seq=6, causal=False,
                                    approximate="tanh", tie_weights=True, ignore_index=-1,
                                    reduction="sum", scale_buffer=True)),
     [i64("tokens", [2, 6], 31), i64("targets", [2, 6], 31, ignore=-1)]),
    # Traced `scores * float`: the tracer records the float as a 0-dim tensor constant.
    ("lm_nll_tuple", "trace",
     lambda: LanguageModel(vocab=20, dim=8, heads=2, layers=2, seq=12, loss="nll",
                           ignore_index=0),
     [i64("tokens", [4, 12], 20), i64("targets", [4, 12], 20, ignore=0)]),
    ("lm_tied_traced", "trace",
     lambda: LossOnly(LanguageModel(vocab=40, dim=12, heads=4, layers=1, seq=8, tie_weights=True,
                                    approximate="tanh", scale_buffer=True)),
     [i64("tokens", [2, 8], 40), i64("targets", [2, 8], 40, ignore=-100)]),
    ("cnn_strided", "script",
     lambda: StridedCNN(3, 6, 4), [f32("x", 4, 3, 15, 13), f32("y", 4, 4)]),
    # Traced BatchNorm2d in training mode: num_batches_tracked.add_(1) gets a tensor constant too.
    ("cnn_grouped", "trace",
     lambda: GroupedCNN(4, 8), [f32("x", 3, 4, 10, 10)]),
    ("cnn_depthwise", "script",
     lambda: DepthwiseClassifier(4, 10, 7), [f32("x", 5, 4, 16, 16), i64("labels", [5], 7)]),
    ("resnet_branches", "script",
     lambda: TinyResNet(2, 6, 3), [f32("x", 2, 2, 12, 12), f32("y", 2, 3)]),
    ("index_gather", "script", IndexGather, [f32("x", 4, 6)]),
    ("index_gather_traced", "trace", IndexGather, [f32("x", 4, 6)]),
    ("index_constant_traced", "trace", IndexConstant, [f32("x", 4, 6)]),
    ("inplace_select", "script", InPlaceOnSelect, [f32("x", 4, 5)]),
    ("inplace_view", "script", InPlaceOnView, [f32("x", 4, 5)]),
    ("inplace_view_traced", "trace", InPlaceOnView, [f32("x", 4, 5)]),
    ("inplace_views_of_views", "script", InPlaceViewsOfViews, [f32("x", 6, 6)]),
    ("inplace_views_of_views_traced", "trace", InPlaceViewsOfViews, [f32("x", 6, 6)]),
]


def source_line(function, needle):
    """"gen_modules.py:N" for the line of `function`'s source that contains `needle`."""
    lines, first = inspect.getsourcelines(function)
    for offset, text in enumerate(lines):
        if needle in text:
            return "%s:%d" % (THIS_FILE, first + offset)
    raise ValueError("%r not in %s" % (needle, function.__qualname__))


# (name, "script" | "trace", constructor, arguments, message substring, source line or None)
ERROR_MODULES = [
    ("err_data_dependent_if", "script", DataDependentBranch, [f32("x", 3, 6)],
     "data-dependent control flow", source_line(DataDependentBranch.forward, "if h.sum() > 0:")),
]

# Bad --input specs for modules of MODULES: (name, module file, specs, message, line or None)
ERROR_SPECS = [
    ("err_missing_input", "mlp_sigmoid_mse", ["x:f32[6,10]"], "missing --input spec for 'y'", None),
    # The Linear fails inside torch.nn; the user's line is the call of the Sequential.
    ("err_dtype_mismatch", "mlp_relu_sum", ["x:i64[4,7]"], "must have the same dtype",
     source_line(ReducedMLP.forward, "out = self.body(x)")),
]


# ---- writing ------------------------------------------------------------------


def seed_for(name):
    """A per-module seed that does not depend on the module's position in the lists."""
    return zlib.crc32(name.encode())


def save_module(make, mode, args, path):
    """Builds, scripts or traces, and saves one module in train mode; returns the eager module."""
    module = make().train()
    if mode == "script":
        scripted = torch.jit.script(module)
    else:
        # Tracing runs forward, which would update BatchNorm statistics: keep
        # the initial buffers so that the saved module starts from them.
        initial = {n: b.detach().clone() for n, b in module.named_buffers()}
        example = tuple(arg.sample() for arg in args)
        scripted = torch.jit.trace(module, example, check_trace=False)
        with torch.no_grad():
            for n, b in scripted.named_buffers():
                b.copy_(initial[n])
    torch.jit.save(scripted, path)
    return module


def flatten_outputs(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flatten_outputs(item)]
    raise TypeError("forward returned a %s" % type(value).__name__)


def snapshot(t):
    return t.detach().contiguous().clone()


def write_expected(pt_path, args, expected_path):
    """Runs a fresh load of pt_path once in train mode on random inputs and saves what it saw."""
    module = torch.jit.load(pt_path)
    module.train()
    inputs = {arg.name: arg.sample() for arg in args}
    # Pass clones so that the recorded inputs are exactly what forward received.
    outputs = module(*[inputs[arg.name].clone() for arg in args])
    torch.save({
        "inputs": {n: snapshot(t) for n, t in inputs.items()},
        "outputs": [snapshot(t) for t in flatten_outputs(outputs)],
        "buffers": {n: snapshot(b) for n, b in module.named_buffers()},
    }, expected_path)


def check_state_names(name, eager, pt_path):
    """The saved module must list the same parameters and buffers as the eager one."""
    loaded = torch.jit.load(pt_path)
    for what in ("named_parameters", "named_buffers"):
        before = [n for n, _ in getattr(eager, what)()]
        after = [n for n, _ in getattr(loaded, what)()]
        if before != after:
            raise RuntimeError("%s: %s() changed on saving: %s -> %s" % (name, what, before, after))


def write_list(path, entries):
    """A JSON list with one entry a line."""
    with open(path, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: %s OUTDIR" % sys.argv[0])
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    manifest = []
    for name, mode, make, args in MODULES:
        torch.manual_seed(seed_for(name))
        pt_path = os.path.join(out, name + ".pt")
        eager = save_module(make, mode, args, pt_path)
        check_state_names(name, eager, pt_path)
        write_expected(pt_path, args, os.path.join(out, name + ".expected.pt"))
        manifest.append({
            "name": name,
            "mode": mode,
            "file": name + ".pt",
            "inputs": [arg.spec() for arg in args],
            "parameters": [n for n, _ in eager.named_parameters()],
            "buffers": [n for n, _ in eager.named_buffers()],
            "frozen": [n for n, p in eager.named_parameters() if not p.requires_grad],
            "expected": name + ".expected.pt",
        })
    write_list(os.path.join(out, "manifest.json"), manifest)

    errors = []
    for name, mode, make, args, message, line in ERROR_MODULES:
        torch.manual_seed(seed_for(name))
        save_module(make, mode, args, os.path.join(out, name + ".pt"))
        errors.append({"name": name, "file": name + ".pt", "inputs": [a.spec() for a in args],
                       "message": message, "line": line})
    for name, module_name, specs, message, line in ERROR_SPECS:
        errors.append({"name": name, "file": module_name + ".pt", "inputs": specs,
                       "message": message, "line": line})
    write_list(os.path.join(out, "errors.json"), errors)
    print("wrote %d modules and %d error cases to %s" % (len(manifest), len(errors), out))


if __name__ == "__main__":
    main()
