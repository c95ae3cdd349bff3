"""The architectures of the libraries people train, through spmd's whole
pipeline against eager PyTorch: does each one train, and if not, why.

  python3 bench/sweep.py BIN_DIR OUT_DIR [--tier ci|families|all] [--device cpu|cuda]
      [--format pt2 --format pt] [--only NAME ...] [--library LIB ...] [--keep-files] [--jobs N] [--timeout S] [--table FILE [--section NAME]]
      [--list]
  python3 bench/sweep.py --merge SWEEP.json [SWEEP.json ...] [--table FILE [--section NAME]]

Models (each built from a seeded small configuration, dropout and stochastic
depth 0, wrapped so that forward returns the training loss):
- torchvision: the classification builders of list_models(module=torchvision.models),
  64 classes, at the smallest image of 32, 48, 64, 75, 96, 128, 160, 224 whose
  train-mode forward runs in eager (ViTs built for it), batch 4 (2 from 128 px);
- timm (where importable): one small model of each family in TIMM;
- transformers (where importable): the architectures in HF at small
  configurations (mixtures of experts among them), called with labels for
  their own loss.
Tiers: ci (a fixed few torchvision models the zoo does not hold: what CTest's
sweep.ci runs on the CPU), families (torchvision's smallest variant of each
family, and every timm and transformers entry), all (every torchvision
builder too).

Each model is written as a torch.export program (.pt2) and a TorchScript
trace (.pt) from the same weights, and each file goes through

  spmd-expand FILE [--input ...] --optimizer sgd --lr 0.01 --momentum 0.9 | spmd-split
    | spmd-unroll --iters 3 | spmd-lower --device DEV -o step.spmd
  spmd-run step.spmd --device DEV --steps 3 --data data.pt --save-params ours.pt

beside a copy of the eager model trained 3 steps by torch.optim.SGD on the
same batches, and twice more from weights one ulp up and one ulp down: how
far rounding alone carries the model (the floor, the farther of the two); on
CUDA both in full fp32 (no TF32 convolutions: spmd-run --no-cudnn-tf32). A
file's result is one of
- trains: the parameters within rtol 1e-3 / atol 1e-5 of eager's, or no
  farther off than FLOOR_MARGIN (4) times the floor;
- refused: spmd-expand exits 1 with one line saying what it does not take;
- failed: any other stage's error, a crash, a timeout or a parity miss;
- not made: torch.export or torch.jit.trace cannot make the file (torch's
  limit, not spmd's; its first line is kept).

A model's files (OUT_DIR/models/NAME) are removed once its results are in, unless
--keep-files. Writes OUT_DIR/sweep.json and OUT_DIR/sweep.md (the table, with date,
commit, machine and library versions), rewritten as results come; --table
FILE puts the table between FILE's `<!-- sweep:begin -->` and
`<!-- sweep:end -->` lines (with --section NAME, `<!-- sweep:NAME:begin -->` and
`<!-- sweep:NAME:end -->`: one file may hold the tables of several runs). Prints a line per model and format. Exits 1 when
any file failed, else 0.
"""
import argparse
import copy
import datetime
import json
import math
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEPS = 3
LR, MOMENTUM = 0.01, 0.9
# A file trains with parity when its parameters are within rtol 1e-3 / atol
# 1e-5 of eager's, or no farther off than FLOOR_MARGIN times eager's own
# drift from weights one ulp away (small BatchNorm nets on 4 images of 32
# pixels are chaotic: rounding alone moves them by whole units in 3 steps).
FLOOR_MARGIN = 4
CLASSES, VOCAB = 64, 128
SIZES = [32, 48, 64, 75, 96, 128, 160, 224]
SIZE_WORDS = {"t", "s", "m", "b", "l", "h", "tiny", "small", "base", "large"}
# Beyond num_classes: no auxiliary heads (their losses are not in the logits).
TV_KWARGS = {"googlenet": {"aux_logits": False, "init_weights": False},
             "inception_v3": {"aux_logits": False, "init_weights": False}}
# torchvision models the zoo (tests/zoo) does not hold, small enough for CI.
CI_MODELS = ["mnasnet0_5", "googlenet", "regnet_x_400mf", "mobilenet_v3_large"]

# timm: one small model a family, with its keyword arguments.
TIMM = {
    "resnet": ("resnet10t", {}), "efficientnet": ("efficientnet_b0", {}),
    "mobilenetv3": ("mobilenetv3_small_050", {}), "convnext": ("convnext_atto", {}),
    "regnet": ("regnetx_002", {}), "vit": ("vit_tiny_patch16_224", {"img_size": 64}),
    "deit": ("deit_tiny_patch16_224", {"img_size": 64}),
    "swin": ("swin_tiny_patch4_window7_224", {"img_size": 224}),
    "mixer": ("mixer_s16_224", {"img_size": 64}), "levit": ("levit_128s", {}),
    "mobilevit": ("mobilevit_xxs", {}), "densenet": ("densenet121", {}),
    "ghostnet": ("ghostnet_100", {}), "repvgg": ("repvgg_a0", {}),
    "efficientformer": ("efficientformer_l1", {}), "edgenext": ("edgenext_xx_small", {}),
}
TIMM_SIZE = {"levit": 224, "swin": 224, "efficientformer": 224}

_LM = dict(vocab_size=VOCAB)
# transformers: (config class, model class, kind, config arguments, attention: "sdpa" unless
# given; "eager" where transformers 5 has no SDPA path for the architecture).
HF = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "lm",
             dict(n_layer=2, n_embd=64, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", "lm",
                 dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                      max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", "lm",
             dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=8, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0), "eager"),
    "opt": ("OPTConfig", "OPTForCausalLM", "lm",
            dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64,
                 max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)),
    "bloom": ("BloomConfig", "BloomForCausalLM", "lm",
              dict(n_layer=2, hidden_size=64, n_head=4, hidden_dropout=0.0, attention_dropout=0.0), "eager"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "lm",
              dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64)),
    "mistral": ("MistralConfig", "MistralForCausalLM", "lm",
                dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, sliding_window=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "lm",
                dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "lm",
              dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64)),
    "phi": ("PhiConfig", "PhiForCausalLM", "lm",
            dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 max_position_embeddings=64, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "lm",
              dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=16, max_position_embeddings=64)),
    "falcon": ("FalconConfig", "FalconForCausalLM", "lm",
               dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, hidden_dropout=0.0,
                    attention_dropout=0.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "lm",
              dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=64)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "lm",
               dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=8,
                    query_pre_attn_scalar=16)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "lm",
               dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=8,
                    query_pre_attn_scalar=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "lm",
             dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, resid_pdrop=0.0,
                  embd_pdrop=0.0, attention_dropout=0.0)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "lm",
              dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", "lm",
                    dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, multi_query=True, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "lm",
                  dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=64)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", "lm",
              dict(num_hidden_layers=2, hidden_size=64, intermediate_size=32, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
                   pad_token_id=0)),
    "bert": ("BertConfig", "BertForMaskedLM", "mlm",
             dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", "mlm",
                dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                     max_position_embeddings=66, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaForMaskedLM", "mlm",
                    dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                         max_position_embeddings=66, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM", "mlm",
                   dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                        max_position_embeddings=64, pad_token_id=0, global_attn_every_n_layers=2,
                        local_attention=8)),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM", "mlm",
                   dict(n_layers=2, dim=64, n_heads=2, hidden_dim=128, max_position_embeddings=64, dropout=0.0,
                        attention_dropout=0.0)),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", "mlm",
                dict(num_hidden_layers=2, embedding_size=64, hidden_size=64, intermediate_size=128,
                     num_attention_heads=2, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)),
    "deberta_v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", "mlm",
                   dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                   "eager"),
    "t5": ("T5Config", "T5ForConditionalGeneration", "seq2seq",
           dict(num_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16, dropout_rate=0.0, decoder_start_token_id=0,
                pad_token_id=0)),
    "bart": ("BartConfig", "BartForConditionalGeneration", "seq2seq",
             dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64, dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0)),
    "marian": ("MarianConfig", "MarianMTModel", "seq2seq",
               dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
                    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, decoder_start_token_id=0,
                    pad_token_id=0)),
    "vit": ("ViTConfig", "ViTForImageClassification", "image",
            dict(image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                 intermediate_size=128, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    "deit": ("DeiTConfig", "DeiTForImageClassification", "image",
             dict(image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                  intermediate_size=128, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    "swin": ("SwinConfig", "SwinForImageClassification", "image",
             dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4,
                  num_labels=10, drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", "image",
                 dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10, drop_path_rate=0.0), "eager"),
}
TOKENS = 16  # sequence length of the language models


def family(name):
    """resnet18 -> resnet, regnet_y_400mf -> regnet_y, vgg11_bn -> vgg_bn,
    efficientnet_v2_s -> efficientnet_v2, shufflenet_v2_x0_5 -> shufflenet_v2_x."""
    kept = []
    for token in name.split("_"):
        if re.fullmatch(r"v\d+", token):
            kept.append(token)
        elif token not in SIZE_WORDS:
            stem = re.match(r"[a-z]*", token).group(0)
            if stem:
                kept.append(stem)
    return "_".join(kept)


# ---- models -------------------------------------------------------------------


def torch_modules():
    import torch
    import torch.nn as nn
    return torch, nn


def no_dropout(model):
    """Every dropout and stochastic depth module of `model` at p = 0."""
    for m in model.modules():
        if hasattr(m, "p") and isinstance(getattr(m, "p"), float) and "drop" in type(m).__name__.lower():
            m.p = 0.0
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if type(m).__name__ == "DropPath" and hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
    return model


def classify(model):
    torch, nn = torch_modules()

    class Classify(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.model(x), y)
    return Classify(model)


def hf_loss(model, kind, extra):
    """A transformers model called with its inputs by name and labels: its own
    loss. The forward's argument names are the programs' input names."""
    torch, nn = torch_modules()

    class TokensLoss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, input_ids, labels):
            return self.model(input_ids=input_ids, labels=labels, **extra).loss

    class PixelsLoss(TokensLoss):
        def forward(self, pixel_values, labels):
            return self.model(pixel_values=pixel_values, labels=labels).loss
    return (PixelsLoss if kind == "image" else TokensLoss)(model)


def images(batch, size, classes=CLASSES):
    return {"x": ("f32", [batch, 3, size, size], None), "y": ("i64", [batch], classes)}


def tv_entry(name):
    kwargs = dict(num_classes=CLASSES, **TV_KWARGS.get(name, {}))
    return {"name": "torchvision." + name, "library": "torchvision", "family": family(name),
            "make": ("tv", name, kwargs)}


def timm_entry(fam):
    model, kwargs = TIMM[fam]
    return {"name": "timm." + model, "library": "timm", "family": fam, "make": ("timm", model, kwargs)}


def hf_entry(key):
    return {"name": "transformers." + HF[key][1], "library": "transformers", "family": key, "make": ("hf", key, {})}


def build(entry):
    """(the loss module, its inputs {name: (dtype, shape, high)}), seeded."""
    torch, _ = torch_modules()
    kind, what, kwargs = entry["make"]
    torch.manual_seed(0)
    if kind == "tv":
        return tv_model(what, kwargs)
    if kind == "timm":
        import timm
        size = TIMM_SIZE.get(entry["family"], kwargs.get("img_size", 64))
        try:
            model = timm.create_model(what, pretrained=False, num_classes=10, drop_rate=0.0, drop_path_rate=0.0,
                                      **kwargs)
        except TypeError:  # a family without stochastic depth
            model = timm.create_model(what, pretrained=False, num_classes=10, drop_rate=0.0, **kwargs)
        return no_dropout(classify(model)).train(), images(2 if size >= 128 else 4, size, 10)
    return hf_model(what)


def tv_model(name, kwargs):
    """A torchvision builder at the smallest image size whose forward runs."""
    torch, _ = torch_modules()
    import torchvision.models as tvm
    last = None
    for size in SIZES:
        args = dict(kwargs, image_size=size) if name.startswith("vit_") else kwargs
        torch.manual_seed(0)
        model = no_dropout(classify(tvm.get_model(name, **args))).train()
        batch = 4 if size < 128 else 2
        try:
            with torch.no_grad():
                copy.deepcopy(model)(torch.randn(batch, 3, size, size), torch.zeros(batch, dtype=torch.long))
        except Exception as e:  # noqa: BLE001 - the next size, else reported
            last = e
            continue
        torch.manual_seed(0)
        return no_dropout(classify(tvm.get_model(name, **args))).train(), images(batch, size)
    raise RuntimeError(f"no image size of {SIZES} runs in eager: {first_line(last)}")


def hf_model(key):
    import transformers
    spec = HF[key]
    config_name, model_name, kind, config = spec[:4]
    attention = spec[4] if len(spec) > 4 else "sdpa"
    def made(attention):
        cfg = getattr(transformers, config_name)(attn_implementation=attention,
                                                 **dict(_LM if kind != "image" else {}, **config))
        return getattr(transformers, model_name)(cfg)
    try:
        model = made(attention)
    except ValueError as e:
        # Which architectures have an SDPA path changes between transformers
        # releases (T5 has none in 5.12): such a model is built as its
        # library builds it then, with eager attention.
        if attention != "sdpa" or "scaled_dot_product_attention" not in str(e):
            raise
        model = made("eager")
    if kind == "image":
        size = config.get("image_size", 32)
        return no_dropout(hf_loss(model, kind, {})).train(), \
            {"pixel_values": ("f32", [4, 3, size, size], None), "labels": ("i64", [4], config["num_labels"])}
    extra = {"use_cache": False} if kind in ("lm", "seq2seq") else {}
    tokens = {"input_ids": ("i64", [2, TOKENS], VOCAB), "labels": ("i64", [2, TOKENS], VOCAB)}
    return no_dropout(hf_loss(model, kind, extra)).train(), tokens


def plan(tier, only):
    """The entries of the tier (or the named ones): transformers', timm's, torchvision's."""
    entries = []
    if tier != "ci":
        if importable("transformers"):
            entries += [hf_entry(k) for k in HF]
        if importable("timm"):
            entries += [timm_entry(f) for f in TIMM]
    try:
        import torchvision
        import torchvision.models as tvm
        names = tvm.list_models(module=torchvision.models)
        if tier == "ci":
            names = CI_MODELS
        elif tier == "families":
            best = {}
            for n in names:
                count = tvm.get_model_weights(n).DEFAULT.meta["num_params"]
                if family(n) not in best or count < best[family(n)][1]:
                    best[family(n)] = (n, count)
            names = sorted(n for n, _ in best.values())
        entries += [tv_entry(n) for n in names]
    except ImportError:
        pass
    if only:
        entries = [e for e in entries if e["name"] in only or e["name"].split(".", 1)[1] in only]
    return entries


def importable(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


# ---- one model ----------------------------------------------------------------


def first_line(e):
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def batches(inputs, device):
    torch, _ = torch_modules()
    generator = torch.Generator().manual_seed(1)
    data = {}
    for name, (dtype, shape, high) in inputs.items():
        full = [STEPS] + shape
        data[name] = (torch.randn(full, generator=generator) if dtype == "f32"
                      else torch.randint(0, high, full, generator=generator))
    return data


def spec(name, dtype, shape):
    return f"--input={name}:{dtype}[{','.join(map(str, shape))}]"


class StageError(Exception):
    def __init__(self, stage, line):
        super().__init__(f"{stage}: {line}")
        self.stage, self.line = stage, line


# The file where a worker notes the stage it is in (its model's folder's
# "at"), so that a model cut off by --timeout can be reported with the stage.
_AT = None
# spmd-run's threads on the CPU: OMP_NUM_THREADS as the sweep was started
# with, else 1 (the worker sets OMP_NUM_THREADS for the other tools).
_RUN_THREADS = os.environ.get("OMP_NUM_THREADS", "1")


def mark(stage):
    if _AT:
        with open(_AT, "w") as f:
            f.write(stage)


def run_tool(cmd, stage, timeout, stdin=None, env=None, times=None):
    mark("running " + stage)
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise StageError(stage, f"timed out after {timeout}s")
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        errors = [l for l in lines if "error" in l]
        line = (errors or lines or [f"exit {proc.returncode}"])[-1]
        if proc.returncode < 0:
            line = f"killed by signal {-proc.returncode}: " + line
        raise StageError(stage + ("" if proc.returncode in (0, 1) else f" (exit {proc.returncode})"), line[:400])
    if times is not None:
        times[stage] = round(time.monotonic() - started, 1)
    return proc.stdout


def pipeline(bin_dir, source, specs, folder, device, timeout, times):
    """spmd's pipeline and run on `source`; the parameters spmd-run saved.
    Each stage's seconds go to `times`."""
    step, ours = os.path.join(folder, "step.spmd"), os.path.join(folder, "ours.pt")
    tool = lambda name: os.path.join(bin_dir, name)  # noqa: E731
    graph = run_tool([tool("spmd-expand"), source, *specs, "--optimizer", "sgd", "--lr", str(LR), "--momentum",
                      str(MOMENTUM)], "spmd-expand", timeout, times=times)
    graph = run_tool([tool("spmd-split")], "spmd-split", timeout, stdin=graph, times=times)
    graph = run_tool([tool("spmd-unroll"), "--iters", str(STEPS)], "spmd-unroll", timeout, stdin=graph, times=times)
    run_tool([tool("spmd-lower"), "--device", device, "-o", step], "spmd-lower", timeout, stdin=graph, times=times)
    env = dict(os.environ, OMP_NUM_THREADS=_RUN_THREADS)
    # Full fp32 on both sides: TF32 convolutions round to 10 bits, and
    # channels-last and NCHW convolutions take different cuDNN algorithms.
    fp32 = ["--no-cudnn-tf32"] if device == "cuda" else []
    run_tool([tool("spmd-run"), step, "--device", device, "--steps", str(STEPS), "--data",
              os.path.join(folder, "data.pt"), "--save-params", ours, *fp32], "spmd-run", timeout, env=env, times=times)
    return ours


def train_eager(model, data, inputs, device):
    torch, _ = torch_modules()
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for s in range(STEPS):
        opt.zero_grad()
        model(*[data[n][s].to(device) for n in inputs]).backward()
        opt.step()
    return {n: p.detach().cpu() for n, p in model.named_parameters()}


def compare(got, eager, floors):
    """(trains, worst abs difference, the floor's worst: the farthest of the
    nudged runs `floors`)."""
    torch, _ = torch_modules()
    missing = [n for n in eager if n not in got]
    if missing:
        return False, float("inf"), 0.0, f"spmd-run saved no parameter {missing[0]}"
    worst = max((float((got[n].double() - p.double()).abs().max()) for n, p in eager.items()), default=0.0)
    floor_worst = max((float((floor[n].double() - p.double()).abs().max()) for floor in floors
                       for n, p in eager.items()), default=0.0)
    close = all(torch.allclose(got[n].float(), p.float(), rtol=1e-3, atol=1e-5) for n, p in eager.items())
    ok = close or worst <= FLOOR_MARGIN * floor_worst
    return ok, worst, floor_worst, "" if ok else f"parameters differ from eager's by up to {worst:.3g} " \
                                                    f"(one ulp's floor {floor_worst:.3g}, times {FLOOR_MARGIN})"


def check(entry, bin_dir, work, device, formats, timeout, progress=None):
    """The results of one model, one per format (each also to `progress`
    as it comes)."""
    torch, _ = torch_modules()
    global _AT
    folder = os.path.join(work, entry["name"])
    os.makedirs(folder, exist_ok=True)
    _AT = os.path.join(folder, "at")
    base = {"name": entry["name"], "library": entry["library"], "family": entry["family"]}
    mark("building the model")
    try:
        model, inputs = build(entry)
    except Exception as e:  # noqa: BLE001 - the model cannot be built here: reported
        return [dict(base, format=f, result="not made", stage="build", why=first_line(e)) for f in formats]
    data = batches(inputs, device)
    torch.save(data, os.path.join(folder, "data.pt"))
    example = tuple(data[n][0] for n in inputs)
    params = sum(p.numel() for p in model.parameters())
    eager = floor = None
    results = []
    for fmt in formats:
        times = {}
        row = dict(base, format=fmt, params=params, inputs={n: s for n, (_, s, _) in inputs.items()}, times=times)
        started = time.monotonic()
        source = os.path.join(folder, "model." + fmt)
        mark("writing its ." + fmt)
        try:
            write_format(model, example, fmt, source)
            times["write"] = round(time.monotonic() - started, 1)
        except Exception as e:  # noqa: BLE001 - torch's limit, reported
            results.append(dict(row, result="not made", stage="torch.export" if fmt == "pt2" else "torch.jit.trace",
                                why=first_line(e)))
            continue
        specs = [spec(n, d, s) for n, (d, s, _) in inputs.items()] if fmt == "pt" else []
        try:
            ours = pipeline(bin_dir, source, specs, folder, device, timeout, times)
            if eager is None:
                mark("training it in eager")
                begun = time.monotonic()
                eager = train_eager(copy.deepcopy(model), data, inputs, device)
                floor = [train_eager(nudged(model, direction), data, inputs, device) for direction in (1, -1)]
                times["eager"] = round(time.monotonic() - begun, 1)
            ok, worst, floor_worst, why = compare(torch.load(ours), eager, floor)
            row.update(result="trains" if ok else "failed", stage="" if ok else "parity", why=why,
                       worst_abs=worst, floor_abs=floor_worst)
        except StageError as e:
            refused = e.stage == "spmd-expand" and "error:" in e.line and "internal error" not in e.line
            row.update(result="refused" if refused else "failed", stage=e.stage, why=e.line)
        row["seconds"] = round(time.monotonic() - started, 1)
        results.append(row)
        if progress:
            progress(results)
    return results


def write_format(model, example, fmt, path):
    torch, _ = torch_modules()
    if fmt == "pt2":
        torch.export.save(torch.export.export(model, example, strict=False), path)
    else:
        torch.jit.trace(model, example, check_trace=False, strict=False).save(path)


def nudged(model, direction):
    """A copy of `model` with every weight one ulp up (direction 1) or down (-1)."""
    torch, _ = torch_modules()
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, direction * math.inf)))
    return other


def worker(entry, bin_dir, work, device, formats, timeout, threads, out):
    """One model in its own process: its results to `out` (JSON)."""
    import torch
    torch.set_num_threads(threads)
    torch.backends.cudnn.allow_tf32 = False  # as spmd-run --no-cudnn-tf32
    # The compiling tools too: JOBS workers whose tools each start a thread
    # per core oversubscribe the machine many times over.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    def save(results):
        with open(out, "w") as f:
            json.dump(results, f)
    try:
        results = check(entry, bin_dir, work, device, formats, timeout, progress=save)
    except Exception as e:  # noqa: BLE001 - the sweep's own failure, reported as such
        results = [dict(name=entry["name"], library=entry["library"], family=entry["family"], format=f,
                        result="failed", stage="sweep", why=first_line(e)) for f in formats]
    with open(out, "w") as f:
        json.dump(results, f)


# ---- the run and its table ------------------------------------------------------


def environment(device):
    import torch
    versions = {"torch": torch.__version__}
    for module in ("torchvision", "timm", "transformers"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            pass
    commit = os.environ.get("SPMD_COMMIT") or git_commit()
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    if device == "cuda":
        machine = torch.cuda.get_device_name() + ", " + machine
    return {"date": datetime.date.today().isoformat(), "commit": commit, "machine": machine, "device": device,
            "versions": versions}


def git_commit():
    """HEAD's commit, read from .git (no git command needed), or "unknown"."""
    try:
        with open(os.path.join(ROOT, ".git", "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref: "):
            return head[:7]
        ref = head[5:]
        loose = os.path.join(ROOT, ".git", ref)
        if os.path.exists(loose):
            with open(loose) as f:
                return f.read().strip()[:7]
        with open(os.path.join(ROOT, ".git", "packed-refs")) as f:
            for line in f:
                if line.strip().endswith(" " + ref):
                    return line.split()[0][:7]
    except OSError:
        pass
    return "unknown"


def table(env, rows, done):
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    counted = [r for r in rows if r["result"] not in ("not made", "not run")]
    trains = sum(r["result"] == "trains" for r in counted)
    lines = [f"Sweep of {env['date']} at {env['commit']} on {env['machine']} ({env['device']}); {versions}"
             f"{'' if done else '; cut off before the end'}. {trains} of {len(counted)} files train with parity, "
             f"{sum(r['result'] == 'refused' for r in counted)} refused, "
             f"{sum(r['result'] == 'failed' for r in counted)} failed; "
             f"{sum(r['result'] == 'not made' for r in rows)} could not be made by torch"
             f"{'; %d not run' % sum(r['result'] == 'not run' for r in rows) if any(r['result'] == 'not run' for r in rows) else ''}.", "",
             "| architecture | format | result | why |", "| --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: (r["library"], r["name"], r["format"])):
        why = (r.get("stage", "") + ": " if r.get("stage") else "") + r.get("why", "")
        lines.append(f"| {r['name']} | {r['format']} | {r['result']} | {why.replace('|', '/')[:200]} |")
    return "\n".join(lines) + "\n"


def put_table(path, text, section=None):
    """`text` between the file's sweep markers (`<!-- sweep:begin -->`, or
    with a section `<!-- sweep:SECTION:begin -->`, and their ends)."""
    try:
        with open(path) as f:
            content = f.read()
    except OSError as e:
        raise SystemExit(f"sweep.py: error: {path}: {e.strerror}")
    name = f"sweep:{section}" if section else "sweep"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in content or end not in content:
        raise SystemExit(f"sweep.py: error: {path}: no '{begin}' ... '{end}' section")
    head, rest = content.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + end + tail)


def merge(paths, table_file, section=None):
    """One table from the sweep.json files of several runs of one machine
    (a device call's time limit cuts a sweep into parts): a later file's row
    of a model and format replaces an earlier one's, except by 'not run'."""
    env, rows = None, {}
    for path in paths:
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"sweep.py: error: {path}: {first_line(e)}")
        if env and (run["machine"], run["versions"]) != (env["machine"], env["versions"]):
            raise SystemExit(f"sweep.py: error: {path}: another machine or other versions than {paths[0]}'s")
        env = env or {k: v for k, v in run.items() if k != "results"}
        for r in run["results"]:
            key = (r["name"], r["format"])
            if r["result"] != "not run" or key not in rows:
                rows[key] = r
    text = table(env, list(rows.values()), done=not any(r["result"] == "not run" for r in rows.values()))
    if table_file:
        put_table(table_file, text, section)
    print(text, end="")
    return 1 if any(r["result"] == "failed" for r in rows.values()) else 0


def main(argv):
    if argv and argv[0] == "--merge":
        table_file = argv[argv.index("--table") + 1] if "--table" in argv[:-1] else None
        section = argv[argv.index("--section") + 1] if "--section" in argv[:-1] else None
        files = [a for a in argv[1:] if a not in ("--table", "--section", table_file, section)]
        if not files:
            raise SystemExit("sweep.py: error: --merge takes the sweep.json files to merge")
        return merge(files, table_file, section)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bin_dir")
    p.add_argument("out_dir")
    p.add_argument("--tier", choices=["ci", "families", "all"], default="families")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--format", action="append", choices=["pt2", "pt"], help="pt2 and pt unless given")
    p.add_argument("--only", action="append", default=[], metavar="NAME")
    p.add_argument("--library", action="append", default=[], choices=["torchvision", "timm", "transformers"],
                   help="only this library's entries (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="models at once (1)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per model (900)")
    p.add_argument("--keep-files", action="store_true",
                   help="keep each model's files (OUT_DIR/models/NAME: its .pt2, .pt, data, step and saved parameters)")
    p.add_argument("--budget", type=int, default=0,
                   help="start no model after this many seconds (0: no limit); the rest are listed as not run")
    p.add_argument("--table", metavar="FILE", help="also put the table into FILE's sweep section")
    p.add_argument("--section", metavar="NAME",
                   help="with --table: the section marked sweep:NAME:begin and sweep:NAME:end")
    p.add_argument("--list", action="store_true", help="print the models and exit")
    a = p.parse_args(argv)
    os.environ.setdefault("PYTORCH_TENSOREXPR", "0")
    entries = [e for e in plan(a.tier, a.only) if not a.library or e["library"] in a.library]
    if a.list:
        print("\n".join(e["name"] for e in entries))
        return 0
    if not entries:
        print("sweep.py: error: no model to sweep", file=sys.stderr)
        return 1
    formats = a.format or ["pt2", "pt"]
    bin_dir, out = os.path.abspath(a.bin_dir), os.path.abspath(a.out_dir)
    work = os.path.join(out, "models")
    os.makedirs(work, exist_ok=True)
    env = environment(a.device)
    threads = max(1, (os.cpu_count() or 1) // a.jobs)
    ctx = multiprocessing.get_context("spawn")
    rows, running, queue = [], {}, list(entries)
    began = time.monotonic()
    while queue or running:
        if a.budget and time.monotonic() - began > a.budget and queue:
            rows += [dict(name=e["name"], library=e["library"], family=e["family"], format=f, result="not run",
                          stage="", why=f"the sweep's budget of {a.budget}s was spent") for e in queue for f in formats]
            queue = []
        while queue and len(running) < a.jobs:
            entry = queue.pop(0)
            result = os.path.join(work, entry["name"] + ".json")
            os.makedirs(os.path.join(work, entry["name"]), exist_ok=True)
            with open(os.path.join(work, entry["name"], "at"), "w") as f:
                f.write("starting its worker")
            proc = ctx.Process(target=worker, args=(entry, bin_dir, work, a.device, formats, a.timeout, threads,
                                                    result))
            proc.start()
            running[proc] = (entry, result, time.monotonic())
        time.sleep(0.5)
        for proc, (entry, result, started) in list(running.items()):
            late = time.monotonic() - started > a.timeout
            if proc.is_alive() and not late:
                continue
            if proc.is_alive():
                proc.kill()
            proc.join()
            del running[proc]
            rows += finished(entry, result, formats, proc.exitcode, late, a.timeout)
            if not a.keep_files:  # a model's files take up to 10 GB (regnet_y_128gf): --tier all fills a disk
                shutil.rmtree(os.path.join(work, entry["name"]), ignore_errors=True)
            for r in rows[-len(formats):]:
                print(f"{r['result']:8} {r['name']} ({r['format']}) {r.get('stage', '')} {r.get('why', '')} "
                      f"{json.dumps(r.get('times', {}))}", flush=True)
            text = table(env, rows, done=not queue and not running and not any(r["result"] == "not run" for r in rows))
            with open(os.path.join(out, "sweep.md"), "w") as f:
                f.write(text)
            with open(os.path.join(out, "sweep.json"), "w") as f:
                json.dump(dict(env, results=rows), f, indent=1)
    if a.table:
        put_table(a.table, table(env, rows, done=not any(r["result"] == "not run" for r in rows)), a.section)
    failed = [r for r in rows if r["result"] == "failed"]
    print(f"{sum(r['result'] == 'trains' for r in rows)} train, {sum(r['result'] == 'refused' for r in rows)} "
          f"refused, {len(failed)} failed, {sum(r['result'] == 'not made' for r in rows)} not made; "
          f"table in {os.path.join(out, 'sweep.md')}")
    return 1 if failed else 0


def finished(entry, result, formats, exitcode, late, timeout):
    """The rows a worker left, and for the formats it did not finish rows
    saying how it ended."""
    rows = []
    if os.path.exists(result):
        with open(result) as f:
            rows = json.load(f)
    why = f"timed out after {timeout}s" if late else f"the worker ended with exit code {exitcode}"
    at = os.path.join(os.path.dirname(result), entry["name"], "at")
    if os.path.exists(at):
        with open(at) as f:
            why += f" while {f.read().strip()}"
    done = {r["format"] for r in rows}
    return rows + [dict(name=entry["name"], library=entry["library"], family=entry["family"], format=f,
                        result="failed", stage="sweep", why=why) for f in formats if f not in done]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
