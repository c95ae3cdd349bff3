"""Real transformers and timm models through spmd's pipeline on one GPU,
against eager PyTorch (fp32, same data, same initial weights).

  python3 bench/gpu_zoo.py BIN_DIR OUT_DIR [NAME ...]

For each model: build it with a seeded small configuration, wrap it so that
forward returns the loss, trace it with torch.jit.trace, run

  spmd-expand M.pt --input ... --optimizer sgd --lr 0.01 --momentum 0.9
    | spmd-lower --device cuda -o M.spmd
  spmd-run M.spmd --device cuda --steps 3 --data data.pt --save-params ours.pt

and train a copy of the eager model for the same 3 steps with torch.optim.SGD
on the same batches, and once more from weights one ulp away: that copy's
distance from the first is the floor, how far rounding alone (TF32,
cuDNN's choice of algorithm and its order of sums) carries the model in
3 steps. Prints one line per model, PASS
(parameters within rtol 1e-3 / atol 1e-5: cuDNN and cuBLAS pick algorithms
per call, so bits differ from eager) or FAIL with the stage and its one-line
message, with the worst relative differences of spmd's and of the floor,
and writes OUT_DIR/gpu_zoo.json. Needs torch 2.x with CUDA, transformers, timm.
"""
import copy
import json
import os
import subprocess
import sys
import traceback

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import HFLoss  # noqa: E402  (bench/models.py: a transformers LM's own loss, as the bench runs it)

STEPS = 3
DEVICE = os.environ.get("SPMD_GPU_ZOO_DEVICE", "cuda")  # cpu: both sides on the CPU, to tell kernels apart
# f64: model and data in float64, where eager's BatchNorm takes the native kernel
# (cuDNN's is fp32/fp16 only) as ours does, and no TF32 applies.
FLOAT = os.environ.get("SPMD_GPU_ZOO_DTYPE", "f32")
# SPMD_GPU_ZOO_STRICT=1: both sides in full fp32 with cuDNN's deterministic algorithms
# (eager: torch.backends.cudnn.allow_tf32 = False, .deterministic = True; spmd-run:
# --no-cudnn-tf32 --cudnn-deterministic), so that what is left of a difference is
# the kernels' own, not TF32's rounding or an algorithm's order of sums.
STRICT = os.environ.get("SPMD_GPU_ZOO_STRICT") == "1"
RUN_FLAGS = "--no-cudnn-tf32 --cudnn-deterministic" if STRICT else ""
LR, MOMENTUM = 0.01, 0.9


class ClassifyLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.model(x), y)


def hf(config_name, model_name, attn="sdpa", **config):
    """A transformers model with the attention implementation `attn`: "sdpa"
    (transformers' default: F.scaled_dot_product_attention) or "eager" (written out)."""
    def make():
        import transformers
        # Through the constructor: transformers reads attn_implementation there, and an
        # attribute set afterwards is not what the model consults.
        cfg = getattr(transformers, config_name)(attn_implementation=attn, **config)
        return HFLoss(getattr(transformers, model_name)(cfg))
    return make


def zoo_model(name, **kw):
    """tests/zoo/zoo.py's models (LlamaLM: Hugging Face's eager LLaMA with its mask as a buffer)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "zoo", "zoo.py")
    found = importlib.util.spec_from_file_location("zoo", path)
    module = importlib.util.module_from_spec(found)
    sys.modules["zoo"] = module
    found.loader.exec_module(module)
    return lambda: getattr(module, name)(**kw)


def timm_model(name, **kw):
    def make():
        import timm
        return ClassifyLoss(timm.create_model(name, pretrained=False, num_classes=10, **kw))
    return make


TOKENS = {"input_ids": ("i64", [4, 32], 128), "labels": ("i64", [4, 32], 128)}
IMAGES = {"x": ("f32", [16, 3, 64, 64], None), "y": ("i64", [16], 10)}

MODELS = {
    "hf_gpt2": (hf("GPT2Config", "GPT2LMHeadModel", n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                   n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), TOKENS),
    "hf_llama": (hf("LlamaConfig", "LlamaForCausalLM", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64), TOKENS),
    "hf_llama_eager_attn": (hf("LlamaConfig", "LlamaForCausalLM", attn="eager", num_hidden_layers=2, hidden_size=64,
                               intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                               max_position_embeddings=64), TOKENS),
    "hf_bert_mlm": (hf("BertConfig", "BertForMaskedLM", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                       num_attention_heads=2, vocab_size=128, max_position_embeddings=64,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), TOKENS),
    "zoo_llama": (zoo_model("LlamaLM", dim=64, heads=4, kv_heads=2, layers=2, seq=32, vocab=128, hidden=128), TOKENS),
    # The bench's llama at a small size, with heads of 64 as there: rotary, nn.RMSNorm,
    # SDPA(is_causal=True, enable_gqa=True).
    "zoo_llama_gqa": (zoo_model("LlamaLoss", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128,
                                max_seq_len=128, hidden=512), {"input_ids": ("i64", [4, 128], 128),
                                                               "labels": ("i64", [4, 128], 128)}),
    # The bench's llama at its own sequence length, width and vocabulary (2 layers, batch 2):
    # the kernels spmd picks at the bench's shapes, against eager.
    "zoo_llama_seq1024": (zoo_model("LlamaLoss", dim=768, n_layers=2, n_heads=12, n_kv_heads=4, vocab_size=32000,
                                    max_seq_len=1024, hidden=2048), {"input_ids": ("i64", [2, 1024], 32000),
                                                                     "labels": ("i64", [2, 1024], 32000)}),
    "zoo_nanogpt": (zoo_model("NanoGPTLoss", vocab_size=128, block_size=128, n_layer=2, n_head=4, n_embd=256),
                    {"idx": ("i64", [4, 128], 128), "targets": ("i64", [4, 128], 128)}),
    "timm_resnet18": (timm_model("resnet18"), IMAGES),
    "timm_resnet18_no_zero_init": (timm_model("resnet18", zero_init_last=False), IMAGES),
    "tv_resnet18": (lambda: ClassifyLoss(__import__("torchvision").models.resnet18(num_classes=10)), IMAGES),
    "tv_vit_b_16": (lambda: ClassifyLoss(__import__("torchvision").models.vit_b_16(image_size=64, num_classes=10)),
                    IMAGES),
    "timm_vit_tiny": (timm_model("vit_tiny_patch16_224", img_size=64, drop_rate=0.0), IMAGES),
    "timm_convnext_atto": (timm_model("convnext_atto"), IMAGES),
    "timm_efficientnet_b0": (timm_model("efficientnet_b0", drop_rate=0.0, drop_path_rate=0.0), IMAGES),
}


def batches(inputs, generator):
    data = {}
    for name, (dtype, shape, high) in inputs.items():
        full = [STEPS] + shape
        data[name] = (torch.randn(full, generator=generator, dtype=torch.float64 if FLOAT == "f64" else torch.float32)
                      if dtype == "f32"
                      else torch.randint(0, high, full, generator=generator))
    return data


def spec(name, dtype, shape):
    return f"--input={name}:{FLOAT if dtype == 'f32' else dtype}[{','.join(map(str, shape))}]"


def run(cmd, stage):
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"{stage}: {lines[-1] if lines else 'exit %d' % proc.returncode}")
    return proc.stdout


def check(name, bin_dir, out_dir):
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    model = make().train()
    if FLOAT == "f64":
        model = model.double()
    data = batches(inputs, torch.Generator().manual_seed(1))
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    pt, step, ours = (os.path.join(folder, f) for f in ("model.pt", "step.spmd", "ours.pt"))
    try:
        traced = torch.jit.trace(model, tuple(data[n][0] for n in inputs), check_trace=False, strict=False)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return {"name": name, "ok": False, "stage": "torch.jit.trace", "why": str(e).splitlines()[0][:300]}
    traced.save(pt)
    torch.save(data, os.path.join(folder, "data.pt"))
    specs = " ".join(spec(n, d, s) for n, (d, s, _) in inputs.items())
    try:
        run(f"{bin_dir}/spmd-expand {pt} {specs} --optimizer sgd --lr {LR} --momentum {MOMENTUM} -o {folder}/step.json",
            "spmd-expand")
        run(f"{bin_dir}/spmd-lower {folder}/step.json --device {DEVICE} -o {step}", "spmd-lower")
        run(f"{bin_dir}/spmd-run {step} --device {DEVICE} --steps {STEPS} --data {folder}/data.pt --save-params {ours}"
            f" {RUN_FLAGS}", "spmd-run")
    except RuntimeError as e:
        return {"name": name, "ok": False, "stage": str(e).split(":")[0], "why": str(e)[:400]}

    nudged = copy.deepcopy(model)
    with torch.no_grad():  # every weight one ulp up
        for p in nudged.parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
    eager = train_eager(model, data, inputs)
    # The floor: eager against itself, from weights one ulp apart, on the same batches:
    # how far rounding alone carries this model in STEPS steps.
    again = train_eager(nudged, data, inputs)
    got = torch.load(ours)
    bad = mismatched(got, eager)
    worst_abs, floor_abs = worst_absolute(got, eager), worst_absolute(again, eager)
    # Where eager one ulp away is not within the tolerance either, the tolerance asks
    # more than the model's own rounding allows: spmd passes if it is no farther off.
    return {"name": name, "ok": not bad or worst_abs <= floor_abs, "within_tolerance": not bad,
            "ulp_floor_abs": floor_abs, "params": len(got), "mismatched": bad[:5], "worst_abs": worst_abs,
            "worst_rel": worst_relative(got, eager), "ulp_floor_rel": worst_relative(again, eager),
            "ulp_floor_mismatched": len(mismatched(again, eager)),
            "attention": attention_of(model)}


def train_eager(model, data, inputs):
    """The eager model after STEPS SGD steps: its parameters by name."""
    model = model.to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for s in range(STEPS):
        opt.zero_grad()
        model(*[data[n][s].to(DEVICE) for n in inputs]).backward()
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def mismatched(got, want):
    """The parameters of `got` not within rtol 1e-3 / atol 1e-5 of `want`'s."""
    return [n for n, p in want.items() if not torch.allclose(got[n].to(DEVICE), p, rtol=1e-3, atol=1e-5)]


def worst_absolute(got, want):
    return max(((got[n].to(DEVICE) - p).abs().max().item() for n, p in want.items()), default=0.0)


def worst_relative(got, want):
    return max((((got[n].to(DEVICE) - p).abs() / (p.abs() + 1e-5)).max().item() for n, p in want.items()),
               default=0.0)


def attention_of(model):
    """transformers' attention implementation, as the model reports it (None for others)."""
    inner = getattr(model, "model", None)
    config = getattr(inner, "config", None)
    return getattr(config, "_attn_implementation", None)


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if STRICT:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
    bin_dir, out_dir, names = argv[0], argv[1], argv[2:] or list(MODELS)
    results = []
    for name in names:
        try:
            r = check(name, bin_dir, out_dir)
        except Exception as e:  # noqa: BLE001
            r = {"name": name, "ok": False, "stage": "script", "why": traceback.format_exc().splitlines()[-1]}
        results.append(r)
        print(("PASS " if r["ok"] else "FAIL ") + json.dumps(r), flush=True)
    with open(os.path.join(out_dir, "gpu_zoo.json"), "w") as f:
        json.dump({"torch": torch.__version__, "strict": STRICT, "device": DEVICE == "cuda" and torch.cuda.get_device_name() or "cpu",
                   "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
