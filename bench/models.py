"""The benchmark models of issues #6 and #14, written as TorchScript for spmd's pipeline.

  python3 bench/models.py OUTDIR [--tiny] [--model NAME]... [--data-ranks 1,2]

For each model (mlp, mlp4096, gpt, llama, resnet50; all by default) writes OUTDIR/NAME.pt
(scripted with torch.jit.script, or traced with example inputs where scripting
fails; gpt (tests/zoo's nanoGPT) and llama (tests/zoo's LLaMA) are traced on one
sample; weights seeded with torch.manual_seed(0), as samples/generate.py makes the
samples), NAME.inputs (the --input flags), NAME.optim (spmd-expand's optimizer
flags: Adam for mlp, mlp4096 and gpt, SGD with momentum for resnet50) and, for each
N in --data-ranks, NAME.dataN.pt: one batch for N ranks in spmd-run's data contract
({input: [1, N*B, ...]}, floats normal, integers (token ids, class labels) uniform
in [0, high) as torch_step.py draws them). Prints one JSON line per model ({"kind":
"model", ...}) on stdout for results.jsonl. --tiny shrinks the models for smoke
tests on CPU (resnet50: torchvision's resnet18, 10 classes, 32x32 images, batch 2).
resnet50 needs torchvision. torch_step.py builds the same modules, and the same
optimizers, from here.
"""
import argparse
import importlib.util
import json
import os
import sys
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
# make(): the module; inputs: per-rank arguments of forward; optimizer: "adam" or
# "sgd", at learning rate lr (and, for sgd, momentum).
# traced: torch.jit.trace it (the zoo's models are written for eager PyTorch, not TorchScript).
Bench = namedtuple("Bench", "name about make inputs lr optimizer momentum traced", defaults=("adam", 0.0, False))

SHORT = {torch.float32: "f32", torch.int64: "i64"}


class Classifier(nn.Module):
    """An image classifier's training loss: cross-entropy of net(x) against targets."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, targets):
        return F.cross_entropy(self.net(x), targets)


def mlp_bench(name, layers, dim, lr, about):
    return Bench(name, about, lambda: MLP(layers=layers, dim=dim), [Input("x", torch.float32, [dim, dim], None)], lr)


def gpt_bench(name, vocab, dim, heads, layers, seq, batch, about):
    """tests/zoo's nanoGPT (Karpathy's model.py: learned positions, LayerNorm with bias, causal
    F.scaled_dot_product_attention, GELU MLP, lm_head tied to wte, nanoGPT's init) with block_size
    seq, on batch x seq tokens; forward returns nanoGPT's loss. Adam lr 1e-3; traced."""
    tokens = [Input(n, torch.int64, [batch, seq], vocab) for n in ("idx", "targets")]
    def make():
        return _zoo().NanoGPTLoss(block_size=seq, vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=dim)
    return Bench(name, about, make, tokens, 1e-3, traced=True)


def llama_bench(name, vocab, dim, heads, kv_heads, layers, hidden, seq, batch, about):
    """tests/zoo's llama (Meta's and torchtitan's structure for PyTorch 2: nn.RMSNorm, rotary,
    grouped-query F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), SwiGLU of width
    hidden, untied head), Adam lr 1e-3; traced."""
    tokens = [Input(n, torch.int64, [batch, seq], vocab) for n in ("input_ids", "labels")]
    def make():
        return _zoo().LlamaLoss(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, vocab_size=vocab,
                                max_seq_len=seq, hidden=hidden)
    return Bench(name, about, make, tokens, 1e-3, traced=True)


def resnet_bench(name, arch, classes, size, batch, about):
    """torchvision.models.ARCH(num_classes=classes) on batch x 3 x size x size images, SGD lr 0.1 momentum 0.9."""
    def make():
        import torchvision  # only this model needs it
        return Classifier(getattr(torchvision.models, arch)(num_classes=classes))
    inputs = [Input("x", torch.float32, [batch, 3, size, size], None), Input("targets", torch.int64, [batch], classes)]
    return Bench(name, about, make, inputs, 0.1, "sgd", 0.9)


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
            "resnet50": resnet_bench("resnet50", "resnet18", 10, 32, 2,
                                     "torchvision resnet18, 10 classes, 3x32x32 images (tiny), loss = cross-entropy"),
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
        "resnet50": resnet_bench("resnet50", "resnet50", 1000, 224, 32,
                                 "torchvision resnet50, 1000 classes, 3x224x224 images, loss = cross-entropy"),
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
    return flags + (" --momentum %g" % bench.momentum if bench.optimizer == "sgd" else "")


def optimizer(bench, params, **impl):
    """torch.optim's optimizer of bench over params; impl: e.g. fused=True or foreach=True."""
    if bench.optimizer == "sgd":
        return torch.optim.SGD(params, lr=bench.lr, momentum=bench.momentum, **impl)
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
    # A traced bench traces one sample (the batch stays a traced size, which
    # spmd-expand's --input sets): its forward on this CPU is 8x cheaper.
    example = tuple(random_input(i._replace(shape=[1] + i.shape[1:]) if bench.traced else i, 1, g)
                    for i in bench.inputs)
    return torch.jit.trace(module, example, check_trace=False), "trace"


def write_model(bench, out):
    """Writes NAME.pt, NAME.inputs, NAME.optim; returns (parameter count, script or trace)."""
    module, how = to_torchscript(bench)
    module.save(os.path.join(out, bench.name + ".pt"))
    with open(os.path.join(out, bench.name + ".inputs"), "w") as f:
        f.write(" ".join("--input " + spec(i) for i in bench.inputs) + "\n")
    with open(os.path.join(out, bench.name + ".optim"), "w") as f:
        f.write(optimizer_flags(bench) + "\n")
    return sum(p.numel() for p in module.parameters()), how


def write_data(bench, out, nproc):
    """One batch for nproc ranks, shaped [1, nproc*B, ...] as spmd-run's --data takes it."""
    g = torch.Generator().manual_seed(1000 + nproc)
    data = {i.name: random_input(i, nproc, g).unsqueeze(0) for i in bench.inputs}
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
        params, how = write_model(bench, args.out)
        for n in [int(r) for r in args.data_ranks.split(",") if r]:
            write_data(bench, args.out, n)
        row = {"kind": "model", "model": name, "about": bench.about, "params": params,
               "inputs": [spec(i) for i in bench.inputs], "optimizer": bench.optimizer, "lr": bench.lr,
               "tiny": args.tiny, "torchscript": how}
        if bench.optimizer == "sgd":
            row["momentum"] = bench.momentum
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
