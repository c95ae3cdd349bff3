"""The benchmark models of issues #6, #14 and #39, written as TorchScript for spmd's pipeline.

  python3 bench/models.py OUTDIR [--tiny] [--model NAME]... [--data-ranks 1,2]

For each model (mlp, mlp4096, gpt, llama, hf_gpt2, hf_llama, vit_b_16, resnet50, convnext_tiny; all by
default) writes OUTDIR/NAME.pt (scripted with torch.jit.script, or traced with example
inputs where scripting fails or the model is written for eager PyTorch: gpt (tests/zoo's
nanoGPT) and llama (tests/zoo's LLaMA) traced on one sample, transformers' GPT2LMHeadModel
and LlamaForCausalLM and torchvision's vit_b_16 on the whole batch; weights seeded with
torch.manual_seed(0), as samples/generate.py makes the samples), NAME.inputs (the --input
flags), NAME.optim (spmd-expand's optimizer flags: Adam for the MLPs, gpt and llama, AdamW
for hf_gpt2, hf_llama, vit_b_16 and convnext_tiny, SGD with momentum for resnet50) and, for each N in
--data-ranks, NAME.dataN.pt: one batch for N ranks in spmd-run's data contract ({input:
[1, N*B, ...]}, floats normal, integers (token ids, class labels) uniform in [0, high) as
torch_step.py draws them). Prints one JSON line per model ({"kind": "model", ...,
"export_s": seconds to build, script or trace and save it}) on stdout for results.jsonl.
--tiny shrinks the models for smoke tests on CPU (resnet50: torchvision's resnet18, 10
classes, 32x32 images, batch 2; vit_b_16: a 2-layer VisionTransformer on 32x32 images;
convnext_tiny: 10 classes, 32x32 images, batch 2).
resnet50, vit_b_16 and convnext_tiny need torchvision, hf_gpt2 and hf_llama transformers (5.x; built
from a config, nothing downloaded), each imported only when its model is built.
torch_step.py builds the same modules, and the same optimizers, from here.
"""
import argparse
import importlib.util
import json
import os
import sys
import time
from collections import namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _samples():
    """samples/models.py, under a name that does not clash with this file's."""
    found = importlib.util.spec_from_file_location("sample_models", os.path.join(ROOT, "samples", "models.py"))
    module = importlib.util.module_from_spec(found)
    sys.modules["sample_models"] = module  # TorchScript looks classes up by module name
    found.loader.exec_module(module)
    return module


_ZOO = None


def _zoo():
    """tests/zoo/zoo.py (loaded once): models written as other projects write them (gpt: nanoGPT,
    llama). Its torchvision import is optional; these two need only torch."""
    global _ZOO
    if _ZOO is None:
        found = importlib.util.spec_from_file_location("zoo", os.path.join(ROOT, "tests", "zoo", "zoo.py"))
        module = importlib.util.module_from_spec(found)
        sys.modules["zoo"] = module
        found.loader.exec_module(module)
        _ZOO = module
    return _ZOO


_SAMPLES = _samples()
MLP, Attention, HandWrittenAttention = _SAMPLES.MLP, _SAMPLES.Attention, _SAMPLES.HandWrittenAttention

# One forward argument: dtype is a torch dtype; high bounds integer values (exclusive).
Input = namedtuple("Input", "name dtype shape high")
# make(): the module; inputs: per-rank arguments of forward; optimizer: "adam", "adamw"
# (weight decay ADAMW_WEIGHT_DECAY) or "sgd", at learning rate lr (and, for sgd, momentum).
# traced: torch.jit.trace it (models written for eager PyTorch, not TorchScript);
# trace_rows: the rows of the batch the trace runs on (None: all of them).
# attention: how the model's own attention runs, as torch_step.py reports it (None: it
# has none, or it is samples' Attention, which torch_step.py sets per precision).
Bench = namedtuple("Bench", "name about make inputs lr optimizer momentum traced trace_rows attention",
                   defaults=("adam", 0.0, False, None, None))

ADAMW_WEIGHT_DECAY = 0.01  # torch.optim.AdamW's default and spmd-expand's for adamw, given to both

SHORT = {torch.float32: "f32", torch.int64: "i64"}


class Classifier(nn.Module):
    """An image classifier's training loss: cross-entropy of net(x) against targets."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, targets):
        return F.cross_entropy(self.net(x), targets)


class HFLoss(nn.Module):
    """A transformers causal LM called with labels: its own loss (shifted labels, cross-entropy
    over fp32 logits), no key/value cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss


def mlp_bench(name, layers, dim, lr, about):
    return Bench(name, about, lambda: MLP(layers=layers, dim=dim), [Input("x", torch.float32, [dim, dim], None)], lr)


def gpt_bench(name, vocab, dim, heads, layers, seq, batch, about):
    """tests/zoo's nanoGPT (Karpathy's model.py: learned positions, LayerNorm with bias, causal
    F.scaled_dot_product_attention, GELU MLP, lm_head tied to wte, nanoGPT's init) with block_size
    seq, on batch x seq tokens; forward returns nanoGPT's loss. Adam lr 1e-3; traced on one sample."""
    tokens = [Input(n, torch.int64, [batch, seq], vocab) for n in ("idx", "targets")]
    def make():
        return _zoo().NanoGPTLoss(block_size=seq, vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=dim)
    return Bench(name, about, make, tokens, 1e-3, traced=True, trace_rows=1, attention="sdpa (the model's own)")


def llama_bench(name, vocab, dim, heads, kv_heads, layers, hidden, seq, batch, about):
    """tests/zoo's llama (Meta's and torchtitan's structure for PyTorch 2: nn.RMSNorm, rotary,
    grouped-query F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), SwiGLU of width
    hidden, untied head), Adam lr 1e-3; traced on one sample."""
    tokens = [Input(n, torch.int64, [batch, seq], vocab) for n in ("input_ids", "labels")]
    def make():
        return _zoo().LlamaLoss(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, vocab_size=vocab,
                                max_seq_len=seq, hidden=hidden)
    return Bench(name, about, make, tokens, 1e-3, traced=True, trace_rows=1, attention="sdpa (the model's own)")


def hf_bench(name, config_class, model_class, vocab, seq, batch, about, **config):
    """transformers' MODEL_CLASS built from CONFIG_CLASS(vocab_size=vocab, **config) with its
    default attention (attn_implementation="sdpa"), called through HFLoss on batch x seq tokens;
    AdamW lr 1e-4. Traced on the whole batch: transformers builds its attention mask from the
    batch's shape in forward (under torch.jit.trace, as under torch.compile, it builds the
    boolean causal mask instead of passing is_causal)."""
    tokens = [Input(n, torch.int64, [batch, seq], vocab) for n in ("input_ids", "labels")]
    def make():
        import transformers  # only these models need it
        cfg = getattr(transformers, config_class)(vocab_size=vocab, attn_implementation="sdpa", **config)
        return HFLoss(getattr(transformers, model_class)(cfg))
    return Bench(name, about, make, tokens, 1e-4, "adamw", traced=True,
                 attention="sdpa (transformers' attn_implementation)")


def hf_gpt2_bench(name, vocab, dim, heads, layers, seq, batch, about):
    """GPT2LMHeadModel (Conv1D projections, gelu_new, tied head) with dropout 0, as gpt has it."""
    return hf_bench(name, "GPT2Config", "GPT2LMHeadModel", vocab, seq, batch, about, n_embd=dim, n_head=heads,
                    n_layer=layers, n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def hf_llama_bench(name, vocab, dim, heads, kv_heads, layers, hidden, seq, batch, about):
    """LlamaForCausalLM (RMSNorm, rotary, grouped-query attention, SwiGLU of width hidden, untied head)."""
    return hf_bench(name, "LlamaConfig", "LlamaForCausalLM", vocab, seq, batch, about, hidden_size=dim,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
                    intermediate_size=hidden, max_position_embeddings=seq)


def hf_mistral_bench(name, vocab, dim, heads, kv_heads, layers, hidden, seq, window, batch, about):
    """MistralForCausalLM (LLaMA's blocks with a sliding-window attention mask of `window` keys:
    under torch.jit.trace transformers builds it as a boolean mask, which no kernel takes as
    is_causal)."""
    return hf_bench(name, "MistralConfig", "MistralForCausalLM", vocab, seq, batch, about, hidden_size=dim,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
                    intermediate_size=hidden, max_position_embeddings=seq, sliding_window=window)


def resnet_bench(name, arch, classes, size, batch, about):
    """torchvision.models.ARCH(num_classes=classes) on batch x 3 x size x size images, SGD lr 0.1 momentum 0.9."""
    def make():
        import torchvision  # only this model needs it
        return Classifier(getattr(torchvision.models, arch)(num_classes=classes))
    return Bench(name, about, make, image_inputs(classes, size, batch), 0.1, "sgd", 0.9)


def convnext_bench(name, classes, size, batch, about):
    """torchvision's convnext_tiny(num_classes=classes), stochastic depth 0 (so that both systems
    train the same network each step), on batch x 3 x size x size images, AdamW lr 1e-3."""
    def make():
        import torchvision  # only this model needs it
        return Classifier(torchvision.models.convnext_tiny(num_classes=classes, stochastic_depth_prob=0.0))
    return Bench(name, about, make, image_inputs(classes, size, batch), 1e-3, "adamw")


def vit_bench(name, classes, size, batch, about, shape=None):
    """torchvision's vit_b_16(num_classes=classes, image_size=size) (dropout 0, its default), or,
    given shape (patch_size, num_layers, num_heads, hidden_dim, mlp_dim), its VisionTransformer of
    that shape; on batch x 3 x size x size images, loss = cross-entropy, AdamW lr 1e-3. Traced on the
    whole batch (nn.MultiheadAttention's training path, F.scaled_dot_product_attention inside)."""
    def make():
        from torchvision.models import vision_transformer  # only this model needs it
        if shape:
            return Classifier(vision_transformer.VisionTransformer(image_size=size, num_classes=classes, **shape))
        return Classifier(vision_transformer.vit_b_16(num_classes=classes, image_size=size))
    return Bench(name, about, make, image_inputs(classes, size, batch), 1e-3, "adamw", traced=True,
                 attention="sdpa (nn.MultiheadAttention)")


def image_inputs(classes, size, batch):
    """batch x 3 x size x size images and their class labels in [0, classes)."""
    return [Input("x", torch.float32, [batch, 3, size, size], None), Input("targets", torch.int64, [batch], classes)]


def benches(tiny=False):
    """name -> Bench; tiny: sizes small enough for a CPU smoke test."""
    if tiny:
        return {
            "mlp": mlp_bench("mlp", 10, 100, 1e-2, "the seeds' MLP (tiny: unchanged)"),
            "mlp4096": mlp_bench("mlp4096", 16, 64, 1e-3, "MLP 16 x Linear(64,64)+ReLU (tiny)"),
            "gpt": gpt_bench("gpt", 64, 32, 2, 2, 16, 8,
                             "nanoGPT vocab 64, dim 32, 2 heads, 2 layers, seq 16 (tiny)"),
            "llama": llama_bench("llama", 64, 32, 4, 2, 2, 96, 16, 8,
                                 "LLaMA (nn.RMSNorm, GQA SDPA), vocab 64, dim 32, 4 heads (2 kv), 2 layers, "
                                 "seq 16 (tiny)"),
            "hf_gpt2": hf_gpt2_bench("hf_gpt2", 64, 32, 2, 2, 16, 8,
                                     "transformers GPT2LMHeadModel vocab 64, dim 32, 2 heads, 2 layers, seq 16 (tiny)"),
            "hf_llama": hf_llama_bench("hf_llama", 64, 32, 4, 2, 2, 64, 16, 8,
                                       "transformers LlamaForCausalLM vocab 64, dim 32, 4 heads (2 kv), 2 layers, "
                                       "seq 16 (tiny)"),
            "hf_mistral": hf_mistral_bench("hf_mistral", 64, 32, 4, 2, 2, 64, 16, 4, 8,
                                           "transformers MistralForCausalLM vocab 64, dim 32, 4 heads (2 kv), 2 layers, "
                                           "seq 16, sliding window 4 (tiny)"),
            "vit_b_16": vit_bench("vit_b_16", 10, 32, 2,
                                  "torchvision VisionTransformer, 2 layers, dim 32, 16x16 patches, 10 classes, "
                                  "3x32x32 images (tiny), loss = cross-entropy",
                                  dict(patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64)),
            "resnet50": resnet_bench("resnet50", "resnet18", 10, 32, 2,
                                     "torchvision resnet18, 10 classes, 3x32x32 images (tiny), loss = cross-entropy"),
            "convnext_tiny": convnext_bench("convnext_tiny", 10, 32, 2,
                                            "torchvision convnext_tiny, 10 classes, 3x32x32 images (tiny), "
                                            "loss = cross-entropy"),
        }
    return {
        "mlp": mlp_bench("mlp", 10, 100, 1e-2, "the seeds' MLP: 10 x Linear(100,100)+ReLU, loss = sum"),
        "mlp4096": mlp_bench("mlp4096", 16, 4096, 1e-3, "MLP 16 x Linear(4096,4096)+ReLU, loss = sum"),
        "gpt": gpt_bench("gpt", 50304, 768, 12, 12, 1024, 8,
                         "nanoGPT (tests/zoo; SDPA, tied embeddings) at GPT-2 small shape: vocab 50304, dim 768, "
                         "12 heads, 12 layers, seq 1024"),
        "llama": llama_bench("llama", 32000, 768, 12, 4, 12, 2048, 1024, 8,
                             "LLaMA (tests/zoo; nn.RMSNorm, rotary, SDPA with enable_gqa): vocab 32000, dim 768, "
                             "12 heads (4 kv), 12 layers, SwiGLU 2048, seq 1024"),
        "hf_gpt2": hf_gpt2_bench("hf_gpt2", 50257, 768, 12, 12, 1024, 8,
                                 "transformers GPT2LMHeadModel at GPT-2 small (SDPA, tied embeddings, dropout 0): "
                                 "vocab 50257, dim 768, 12 heads, 12 layers, seq 1024"),
        # Llama 3.2 1B's body (16 layers of 2048, 32 heads of which 8 key/value, SwiGLU 8192)
        # with LLaMA 2's vocabulary and an untied head; batch 4 keeps fp32 AdamW within 80 GB.
        "hf_llama": hf_llama_bench("hf_llama", 32000, 2048, 32, 8, 16, 8192, 1024, 4,
                                   "transformers LlamaForCausalLM (SDPA, GQA): vocab 32000, dim 2048, 32 heads "
                                   "(8 kv), 16 layers, SwiGLU 8192, seq 1024"),
        "hf_mistral": hf_mistral_bench("hf_mistral", 32000, 768, 12, 4, 12, 2048, 1024, 256, 8,
                                       "transformers MistralForCausalLM (SDPA, GQA, sliding window 256): vocab 32000, "
                                       "dim 768, 12 heads (4 kv), 12 layers, SwiGLU 2048, seq 1024"),
        "vit_b_16": vit_bench("vit_b_16", 1000, 224, 64,
                              "torchvision vit_b_16, 1000 classes, 3x224x224 images, loss = cross-entropy"),
        "resnet50": resnet_bench("resnet50", "resnet50", 1000, 224, 32,
                                 "torchvision resnet50, 1000 classes, 3x224x224 images, loss = cross-entropy"),
        "convnext_tiny": convnext_bench("convnext_tiny", 1000, 224, 32,
                                        "torchvision convnext_tiny (stochastic depth 0), 1000 classes, 3x224x224 "
                                        "images, loss = cross-entropy"),
    }


def build(bench):
    """The module with its seeded weights (the same on every call and rank)."""
    torch.manual_seed(0)
    return bench.make().train()


def spec(inp):
    """spmd's --input syntax: x:f32[100,100]."""
    return "%s:%s[%s]" % (inp.name, SHORT[inp.dtype], ",".join(str(d) for d in inp.shape))


def random_input(inp, rows_scale=1, generator=None):
    """A random tensor for inp (normal floats, integers uniform in [0, high)), batch x rows_scale."""
    shape = [inp.shape[0] * rows_scale] + list(inp.shape[1:])
    if inp.dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=inp.dtype)
    return torch.randint(0, inp.high, shape, generator=generator, dtype=inp.dtype)


def optimizer_flags(bench):
    """spmd-expand's optimizer flags: --optimizer adam --lr 0.001."""
    flags = "--optimizer %s --lr %g" % (bench.optimizer, bench.lr)
    if bench.optimizer == "sgd":
        return flags + " --momentum %g" % bench.momentum
    if bench.optimizer == "adamw":
        return flags + " --weight-decay %g" % ADAMW_WEIGHT_DECAY
    return flags


def optimizer(bench, params, **impl):
    """torch.optim's optimizer of bench over params; impl: e.g. fused=True or foreach=True."""
    if bench.optimizer == "sgd":
        return torch.optim.SGD(params, lr=bench.lr, momentum=bench.momentum, **impl)
    if bench.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=bench.lr, weight_decay=ADAMW_WEIGHT_DECAY, **impl)
    return torch.optim.Adam(params, lr=bench.lr, **impl)


def to_torchscript(bench):
    """(scripted module, how): torch.jit.script, or torch.jit.trace on example inputs if scripting fails
    or the bench is traced."""
    module = build(bench)
    if not bench.traced:
        try:
            return torch.jit.script(module), "script"
        except Exception as e:  # noqa: BLE001  (TorchScript raises many kinds)
            print("models.py: torch.jit.script(%s) failed (%s: %s); tracing instead"
                  % (bench.name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""), file=sys.stderr)
    g = torch.Generator().manual_seed(0)
    # The zoo's LMs trace one sample (the batch stays a traced size, which
    # spmd-expand's --input sets): their forward on this CPU is 8x cheaper.
    rows = bench.trace_rows
    example = tuple(random_input(i._replace(shape=[rows] + i.shape[1:]) if rows else i, 1, g) for i in bench.inputs)
    return torch.jit.trace(module, example, check_trace=False), "trace"


def write_model(bench, out):
    """Writes NAME.pt, NAME.inputs, NAME.optim; returns (parameter count, script or trace, seconds to
    build, convert and save the module)."""
    begin = time.perf_counter()
    module, how = to_torchscript(bench)
    module.save(os.path.join(out, bench.name + ".pt"))
    seconds = time.perf_counter() - begin
    with open(os.path.join(out, bench.name + ".inputs"), "w") as f:
        f.write(" ".join("--input " + spec(i) for i in bench.inputs) + "\n")
    with open(os.path.join(out, bench.name + ".optim"), "w") as f:
        f.write(optimizer_flags(bench) + "\n")
    return sum(p.numel() for p in module.parameters()), how, seconds


def rank_inputs(bench, rank):
    """Rank rank's batch, one tensor per input: torch_step.py's draw, so that every system trains on
    the same data and their first losses can be compared."""
    g = torch.Generator().manual_seed(rank)
    return [random_input(i, 1, g) for i in bench.inputs]


def write_data(bench, out, nproc):
    """One batch for nproc ranks, shaped [1, nproc*B, ...] as spmd-run's --data takes it: rank r's
    rows are rank_inputs(bench, r)."""
    per_rank = [rank_inputs(bench, r) for r in range(nproc)]
    data = {i.name: torch.cat([batch[k] for batch in per_rank]).unsqueeze(0) for k, i in enumerate(bench.inputs)}
    torch.save(data, os.path.join(out, "%s.data%d.pt" % (bench.name, nproc)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--model", action="append", help="model name (repeatable; default: all)")
    p.add_argument("--data-ranks", default="", help="comma-separated rank counts to write data files for")
    args = p.parse_args()
    table = benches(args.tiny)
    names = args.model or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        p.error("unknown model %s (choose from %s)" % (", ".join(unknown), ", ".join(table)))
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        bench = table[name]
        params, how, seconds = write_model(bench, args.out)
        for n in [int(r) for r in args.data_ranks.split(",") if r]:
            write_data(bench, args.out, n)
        row = {"kind": "model", "model": name, "about": bench.about, "params": params,
               "inputs": [spec(i) for i in bench.inputs], "optimizer": bench.optimizer, "lr": bench.lr,
               "tiny": args.tiny, "torchscript": how, "export_s": round(seconds, 3)}
        if bench.optimizer == "sgd":
            row["momentum"] = bench.momentum
        if bench.optimizer == "adamw":
            row["weight_decay"] = ADAMW_WEIGHT_DECAY
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
