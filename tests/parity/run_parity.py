"""Data-parallel parity tests: spmd's pipeline against PyTorch DDP.

  run_parity.py BIN_DIR [--case NAME ...] [--strict] [--sharded] [--list] [--keep]
                [--python PY] [--timeout SECONDS] [--zoo DIR [--format pt|pt2|core.pt2 ...]]
                [--tier core|long] [--reference-cache DIR]

For each case it writes the reference with ddp_reference.py (PyTorch DDP on
Gloo, N local processes) into a temporary folder, which also gives the data
file (with --reference-cache DIR, taken from DIR when an earlier run made it
from the same inputs: see reference()), then runs spmd's pipeline on the same
sample and data, in one process:

  BIN/spmd-compile samples/X.pt <samples/X.inputs> OPTIMIZER-FLAGS EXTRA-FLAGS --iters S -o TMP/step.spmd
  BIN/spmd-run TMP/step.spmd --nproc N --steps S --data TMP/data.pt
    --save-params TMP/ours.pt --device cpu

(the cases not unrolled, and the make_fx-exported steps, which start at
spmd-split, run the tools: spmd-expand | spmd-split [| spmd-unroll] | spmd-lower)
and compares rank 0's parameters as compare_params.py does (in this process
when it runs the reference's python): bit for bit unless
a case says why not (then rtol 1e-4, atol 1e-6). With --zoo DIR it runs the zoo's cases instead, on the models
tests/zoo/gen_zoo.py wrote to DIR (NAME.pt, NAME.inputs). EXTRA-FLAGS (--bucket-cap-mb, --first-bucket-cap-mb,
--ignore-param) go to spmd-split and to ddp_reference.py alike.

Prints `PASS NAME` or `FAIL NAME: REASON` (then the failing tool's output,
indented) per case and a last line `N passed, M failed`; exits 1 if any
failed. --list prints the cases; --case runs only the named ones (repeatable);
--sharded runs the cases of sharded steps (spmd-split --shard) instead of the others;
--strict adds the cases marked strict (see below); --keep keeps every case's
folder (a failing case's folder is always kept and named).

The numerics. Most cases must give DDP's bits: spmd runs the same ATen
kernels in the same order, torch.optim's formulas included (Adam's first
moment as lerp). The cases that cannot (more than two ranks, a scheduled
SGD rate, steps exported with make_fx, core ATen) agree to 1e-4 and are
chosen such that the reference is insensitive to rounding: retraining it with
every gradient perturbed by 1-4 ulps, or computed in float64 and rounded,
moves no parameter beyond that tolerance. Adam amplifies gradients that are
pure rounding noise (lr * g / (|g| + eps): attention's key bias, whose true
gradient is 0; MLP weights whose gradient cancels) into full-size updates, so
most Adam cases use a larger eps (as tests/export does for the LM); max-pool
and ReLU near-ties make some data seeds flip a branch under a 1-ulp change,
so the seeds are picked (seed 0 does so for cnn + --ignore-param fc.bias at
step 5). The strict cases keep torch.optim's default eps 1e-8.
"""
import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import namedtuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# optimizer: spmd-expand's and ddp_reference.py's optimizer and precision
# flags (the same names); extra: spmd-split's and ddp_reference.py's flags (the same names).
# `optimizer` flags go to spmd-expand and the reference, `extra` to spmd-split
# and the reference; `unroll`: the pipeline runs spmd-unroll.
# program: the file spmd-expand reads instead of the sample's TorchScript
# module, a torch.export program (.pt2) whose shapes come with it (no --input).
# shard: spmd-split --shard MODE --world-size NPROC (ZeRO); DDP stays the oracle,
# since a sharded step computes the same numbers.
# rtol, atol: compare_params.py's tolerances; 0 and 0 (the default) ask for
# the same bits.
Case = namedtuple("Case", "name sample optimizer nproc steps extra seed strict unroll atol program shard rtol",
                  defaults=[True, 0.0, None, None, 0.0])

ADAM = "--optimizer adam --lr 1e-2 --eps 1e-2"
# Where the same bits cannot be asked for (each case says why): within 1e-4
# relative, 1e-6 absolute. So too every case of more than two ranks: from
# three on, Gloo's ring adds each element's terms in an order that follows
# its place in the bucket, and spmd's buckets are not laid out as DDP's (the
# same sum, rounded otherwise).
NEAR = dict(rtol=1e-4, atol=1e-6)


def tolerance(case):
    """(rtol, atol) for comparing the case's parameters with DDP's."""
    if case.nproc > 2 and case.rtol == 0 and case.atol == 0:
        return NEAR["rtol"], NEAR["atol"]
    return case.rtol, case.atol
SGD_MOMENTUM = "--optimizer sgd --lr 0.05 --momentum 0.9"
CASES = [
    Case("mlp_adam", "mlp", ADAM, 2, 5, "", 1, False),
    Case("lm_adamw", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 2, 5, "", 1, False),
    Case("cnn_sgd_momentum", "cnn", SGD_MOMENTUM, 2, 5, "", 1, False),
    # DDP's first bucket holds 1 MiB (the whole MLP, 10 x 40400 bytes) unless
    # its cap is lowered too; with both at 0.05 MiB DDP and spmd-split both
    # make five buckets of two layers (DDP from step 2 on: its first step
    # runs with one bucket, then it rebuilds).
    Case("mlp_adam_buckets", "mlp", ADAM, 2, 5, "--bucket-cap-mb 0.05 --first-bucket-cap-mb 0.05", 1, False),
    Case("mlp_adam_small_cap", "mlp", ADAM, 2, 5, "--bucket-cap-mb 0.05", 1, False),
    Case("cnn_sgd_ignore_fc_bias", "cnn", SGD_MOMENTUM, 2, 5, "--ignore-param fc.bias", 1, False),
    Case("cnn_sgd_ignore_two_n3", "cnn", SGD_MOMENTUM, 3, 5,
         "--ignore-param bn2.weight --ignore-param conv1.weight", 1, False),
    Case("mlp_sgd_nesterov_wd_n4", "mlp",
         "--optimizer sgd --lr 1e-3 --momentum 0.9 --nesterov --weight-decay 1e-2", 4, 5, "", 1, False),
    Case("mlp_adam_amsgrad_wd", "mlp", ADAM + " --amsgrad --weight-decay 1e-2", 2, 5, "", 1, False),
    Case("lm_adamw_n4", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 4, 5, "", 1, False),
    # Eight ranks, as on one 8-GPU box (issue #7), with several buckets.
    Case("mlp_adam_n8", "mlp", ADAM, 8, 5, "--bucket-cap-mb 0.05 --first-bucket-cap-mb 0.05", 1, False),
    # make_fx-exported train steps (spmd_export), entering the pipeline at
    # spmd-split: their optimizer is the one make_fx traced, not torch.optim's
    # own kernels.
    Case("export_mlp_adam", "mlp", ADAM, 2, 5, "", 1, False, **NEAR),
    Case("export_lm_adamw", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 2, 5, "", 1, False, **NEAR),
    Case("export_cnn_sgd_momentum", "cnn", SGD_MOMENTUM, 2, 5, "--bucket-cap-mb 0.002 --first-bucket-cap-mb 0.002", 1,
         False),
    # Mixed precision: the forward under torch.autocast("cpu", bfloat16) in
    # DDP, spmd-expand --autocast cpu:bf16; gradients all-reduced in fp32, or
    # in fp16 as DDP's fp16_compress_hook does (DDP's bf16_compress_hook needs
    # NCCL, so --reduce-dtype bf16 has no DDP oracle on Gloo).
    Case("mlp_adam_autocast_bf16", "mlp", ADAM + " --autocast cpu:bf16", 2, 5, "", 1, False),
    Case("lm_adamw_autocast_bf16", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5 --autocast cpu:bf16", 2, 5, "", 1,
         False),
    Case("cnn_sgd_autocast_bf16", "cnn", SGD_MOMENTUM + " --autocast cpu:bf16", 2, 5, "", 1, False),
    Case("lm_adamw_autocast_bf16_reduce_f16", "lm",
         "--optimizer adamw --lr 1e-2 --eps 1e-5 --autocast cpu:bf16 --reduce-dtype f16", 2, 5, "", 1, False),
    # Training-step features (issue #16): schedules, clipping, accumulation,
    # alone and together, unrolled and not, with buckets and with autocast.
    Case("mlp_adamw_cosine", "mlp",
         "--optimizer adamw --lr 1e-2 --eps 1e-5 --lr-schedule cosine --warmup-steps 2 --decay-steps 6 --min-lr 1e-3",
         2, 8, "", 1, False),
    Case("lm_adam_linear_warmup", "lm",
         "--optimizer adam --lr 1e-2 --eps 1e-5 --lr-schedule linear --warmup-steps 1 --decay-steps 4 --min-lr 1e-4",
         2, 6, "", 1, False, False),
    # A scheduled rate is a tensor of the step: SGD's update is param - lr * d_p
    # in two roundings, where torch.optim's add_(d_p, alpha=-lr) fuses them
    # (ATen's add is one fused multiply-add).
    Case("cnn_sgd_step_schedule", "cnn", SGD_MOMENTUM + " --lr-schedule step --step-size 2 --gamma 0.5", 2, 5, "", 1,
         False, **NEAR),
    Case("lm_adamw_clip", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5 --clip-grad-norm 0.05", 2, 5, "", 1, False),
    Case("mlp_adam_clip_inf_buckets", "mlp", ADAM + " --clip-grad-norm 0.5 --clip-grad-norm-type inf", 2, 5,
         "--bucket-cap-mb 0.05 --first-bucket-cap-mb 0.05", 1, False),
    Case("cnn_sgd_micro_batches", "cnn", SGD_MOMENTUM + " --micro-batches 2", 2, 5, "", 1, False),
    Case("mlp_adam_micro_batches_buckets", "mlp", ADAM + " --micro-batches 3", 2, 5,
         "--bucket-cap-mb 0.05 --first-bucket-cap-mb 0.05", 1, False),
    Case("lm_adamw_all_three", "lm",
         "--optimizer adamw --lr 1e-2 --eps 1e-5 --lr-schedule cosine --warmup-steps 2 --decay-steps 5 --min-lr 1e-3 "
         "--clip-grad-norm 0.05 --micro-batches 2", 2, 7, "--bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01", 1, False),
    Case("cnn_sgd_all_three_not_unrolled", "cnn",
         SGD_MOMENTUM + " --lr-schedule cosine --warmup-steps 1 --decay-steps 4 --clip-grad-norm 0.5 --micro-batches 2",
         2, 5, "", 1, False, False, **NEAR),
    Case("mlp_adam_all_three_autocast_bf16", "mlp",
         ADAM + " --lr-schedule step --step-size 2 --clip-grad-norm 0.5 --micro-batches 2 --autocast cpu:bf16",
         2, 5, "", 1, False),
    # torch.export programs in the PT2 archive layout of torch 2.8 and later
    # (tests/pt2/fixtures, written by torch 2.14 from the samples' weights):
    # the training IR and core ATen.
    Case("pt2_mlp_adam", "mlp", ADAM, 2, 5, "", 1, False, program="tests/pt2/fixtures/mlp.pt2"),
    Case("pt2_lm_adamw_buckets", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 2, 5,
         "--bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01", 1, False, program="tests/pt2/fixtures/lm.pt2"),
    Case("pt2_cnn_sgd_momentum", "cnn", SGD_MOMENTUM, 2, 5, "", 1, False, program="tests/pt2/fixtures/cnn.pt2"),
    # Core ATen decomposes LayerNorm, softmax and GELU into ops that round
    # otherwise than eager's fused kernels.
    Case("pt2_core_lm_adamw", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 2, 5, "", 1, False,
         program="tests/pt2/fixtures/lm.core.pt2", **NEAR),
    Case("pt2_core_cnn_sgd_clip_micro_batches", "cnn", SGD_MOMENTUM + " --clip-grad-norm 0.5 --micro-batches 2", 2, 5,
         "", 1, False, program="tests/pt2/fixtures/cnn.core.pt2"),
    # Sharded data parallelism (spmd-split --shard): ZeRO-1 and ZeRO-2 at 2,
    # 3 and 4 ranks, with the step's features; 3 ranks pad most shards.
    # DDP is the oracle: a sharded step computes the same numbers.
    Case("lm_adamw_shard_optimizer", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 2, 5, "", 1, False,
         shard="optimizer"),
    Case("lm_adam_shard_gradients_n4_buckets", "lm", "--optimizer adam --lr 1e-2 --eps 1e-5", 4, 5,
         "--bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01", 1, False, shard="gradients"),
    Case("cnn_sgd_shard_optimizer_n4", "cnn", SGD_MOMENTUM, 4, 5, "", 1, False, shard="optimizer"),
    Case("cnn_sgd_shard_gradients_n3_ignore", "cnn", SGD_MOMENTUM, 3, 5, "--ignore-param fc.bias", 1, False,
         shard="gradients"),
    Case("mlp_adam_shard_gradients_n4_amsgrad_wd", "mlp", ADAM + " --amsgrad --weight-decay 1e-2", 4, 5,
         "--bucket-cap-mb 0.05 --first-bucket-cap-mb 0.05", 1, False, shard="gradients"),
    # A sharded step's gradient norm adds up the shards' sums of squares, where
    # clip_grad_norm_ takes each whole gradient's norm: the clip coefficient
    # can round otherwise.
    Case("lm_adamw_shard_optimizer_all_three", "lm",
         "--optimizer adamw --lr 1e-2 --eps 1e-5 --lr-schedule cosine --warmup-steps 2 --decay-steps 5 --min-lr 1e-3 "
         "--clip-grad-norm 0.05 --micro-batches 2", 2, 7, "--bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01", 1, False,
         shard="optimizer", **NEAR),
    Case("mlp_adam_shard_gradients_clip_inf_n3", "mlp", ADAM + " --clip-grad-norm 0.5 --clip-grad-norm-type inf", 3, 5,
         "--bucket-cap-mb 0.05 --first-bucket-cap-mb 0.05", 1, False, shard="gradients"),
    Case("cnn_sgd_shard_optimizer_clip_micro_batches_not_unrolled", "cnn",
         SGD_MOMENTUM + " --clip-grad-norm 0.5 --micro-batches 2", 2, 5, "", 1, False, False, shard="optimizer"),
    # Two ranks: an fp16 sum of four ranks' gradients rounds by the order of
    # its terms, which a ring all-reduce and a reduce-scatter take differently.
    Case("lm_adamw_shard_gradients_autocast_bf16_reduce_f16", "lm",
         "--optimizer adamw --lr 1e-2 --eps 1e-5 --autocast cpu:bf16 --reduce-dtype f16", 2, 5, "", 1, False,
         shard="gradients"),
    Case("cnn_sgd_shard_optimizer_autocast_bf16", "cnn", SGD_MOMENTUM + " --autocast cpu:bf16", 2, 5, "", 1, False,
         shard="optimizer"),
    Case("pt2_lm_adamw_shard_optimizer_n4", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 4, 5, "", 1, False,
         program="tests/pt2/fixtures/lm.pt2", shard="optimizer"),
    # ZeRO-3 (--shard parameters): the parameters too are shards, gathered
    # whole for the forward and again for the backward.
    Case("lm_adamw_shard_parameters", "lm", "--optimizer adamw --lr 1e-2 --eps 1e-5", 2, 5, "", 1, False,
         shard="parameters"),
    Case("lm_adam_shard_parameters_n4_buckets", "lm", "--optimizer adam --lr 1e-2 --eps 1e-5", 4, 5,
         "--bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01", 1, False, shard="parameters"),
    Case("cnn_sgd_shard_parameters_n4", "cnn", SGD_MOMENTUM, 4, 5, "", 1, False, shard="parameters"),
    Case("mlp_adam_shard_parameters_n3_clip_micro_batches", "mlp", ADAM + " --clip-grad-norm 0.5 --micro-batches 2", 3,
         5, "--bucket-cap-mb 0.05 --first-bucket-cap-mb 0.05", 1, False, shard="parameters"),
    Case("cnn_sgd_shard_parameters_autocast_bf16_not_unrolled", "cnn", SGD_MOMENTUM + " --autocast cpu:bf16", 2, 5,
         "", 1, False, False, shard="parameters"),
    Case("lm_adamw_shard_parameters_all_three_n4", "lm",
         "--optimizer adamw --lr 1e-2 --eps 1e-5 --lr-schedule cosine --warmup-steps 2 --decay-steps 5 --min-lr 1e-3 "
         "--clip-grad-norm 0.05 --micro-batches 2", 4, 7, "--bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01", 1, False,
         shard="parameters"),
    Case("strict_mlp_adam_eps1e-8", "mlp", "--optimizer adam --lr 1e-2", 2, 5, "", 0, True),
    # The LM's key bias, whose gradient is rounding noise that eps 1e-8 lets
    # Adam turn into full steps, agrees only because every rounding does.
    Case("strict_lm_adamw_eps1e-8", "lm", "--optimizer adamw --lr 1e-2", 2, 5, "", 0, True),
]
# The model zoo (tests/zoo/zoo.py; --zoo DIR with gen_zoo.py's files): models
# nobody here wrote, 3 steps on 2 ranks, bit for bit: SGD with momentum, and
# for the transformers torch.optim's Adam and AdamW at their default eps.
ZOO_SGD = "--optimizer sgd --lr 0.01 --momentum 0.9"
ZOO_OPTIMIZERS = {"adam": "--optimizer adam --lr 1e-3", "adamw": "--optimizer adamw --lr 1e-3"}
ZOO_OPTIMIZER_OF = {"vit": "adam", "gpt2_hf_style": "adam", "transformer_encoder_lm": "adam",
                    "nanogpt": "adamw", "llama_hf_style": "adamw", "t5_hf_style": "adamw",
                    "swin": "adamw"}

# Not yet bit for bit on torch 2.6 (a few weights in their last bits after 3
# SGD steps, up to 1.5e-8; the cause is not found): nn.LSTM and nn.GRU, whose
# weights are read at every time step.
ZOO_NEAR = {"lstm", "gru"}

ZOO_CASES = [Case("zoo_" + name, name, ZOO_OPTIMIZERS.get(ZOO_OPTIMIZER_OF.get(name), ZOO_SGD), 2, 3, "", 1, False,
                  **(NEAR if name in ZOO_NEAR else {}))
             for name in [
    "resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2", "squeezenet",
    "densenet121", "regnet", "vit", "convnext", "swin", "transformer_encoder_lm", "transformer_seq2seq",
    "transformer_decoder", "lstm", "gru", "gpt2_hf_style", "llama_hf_style",
    # PyTorch 2 as written today: SDPA (with enable_gqa), nn.RMSNorm, a key-padding
    # mask built in forward, torchvision's builders.
    "nanogpt", "llama", "transformer_encoder_padding", "transformer_encoder_padding_causal", "vit_b_16",
    "swin_v2_t", "efficientnet_v2_s", "convnext_tiny", "resnet50",
    # T5's relative-position buckets (a float log cast back to int64).
    "t5_hf_style"]]
TOOLS = ["spmd-expand", "spmd-split", "spmd-unroll", "spmd-lower", "spmd-compile", "spmd-run"]

# `make test`'s tier (--tier core): each capability once (every optimizer,
# buckets, ignored parameters, 3 and 4 ranks, exported steps, autocast and a
# reduced dtype, schedules with clipping and micro-batches unrolled and not,
# .pt2 and core ATen, each sharding mode, the zoo's kinds of model); the
# long tier (--tier long, `make test-long`) is every other case.
CORE_CASES = {
    "cnn_sgd_ignore_two_n3", "mlp_sgd_nesterov_wd_n4", "mlp_adam_amsgrad_wd", "export_lm_adamw",
    "lm_adamw_autocast_bf16_reduce_f16", "lm_adamw_all_three", "cnn_sgd_all_three_not_unrolled",
    "mlp_adam_all_three_autocast_bf16", "pt2_lm_adamw_buckets", "pt2_core_cnn_sgd_clip_micro_batches",
    "strict_lm_adamw_eps1e-8",
    "lm_adamw_shard_optimizer", "mlp_adam_shard_gradients_n4_amsgrad_wd", "lm_adamw_shard_parameters_all_three_n4",
    "cnn_sgd_shard_parameters_autocast_bf16_not_unrolled",
    # zoo.sharded and zoo.ddp.core_pt2 (also make test's) train swin and the LSTM.
    "zoo_resnet18", "zoo_convnext_tiny", "zoo_gpt2_hf_style", "zoo_nanogpt", "zoo_llama", "zoo_t5_hf_style",
}


def default_python():
    for py in (os.environ.get("SPMD_TORCH_PYTHON"), "/usr/bin/python3"):
        if py and os.access(py, os.X_OK):
            return py
    return sys.executable


class Failure(Exception):
    def __init__(self, reason, details=""):
        super().__init__(reason)
        self.reason, self.details = reason, details


def run(argv, timeout, stdin=None, what=None, env=None):
    """Runs argv from the repository root; returns its stdout (bytes); raises Failure."""
    what = what or os.path.basename(argv[0])
    try:
        proc = subprocess.run(argv, cwd=ROOT, input=stdin, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{what} timed out after {timeout}s", (e.stderr or b"").decode(errors="replace"))
    except OSError as e:
        raise Failure(f"{what} could not start: {e}")
    if proc.returncode != 0:
        out = proc.stderr.decode(errors="replace")
        if not out.strip():
            out = proc.stdout.decode(errors="replace")[-4000:]
        raise Failure(f"{what} exit {proc.returncode}", out)
    return proc.stdout


def run_case(case, bin_dir, python, tmp, timeout, zoo_dir=None, zoo_module=None, zoo_formats=("pt",),
             reference_cache=None):
    """Runs one case in folder tmp; returns compare_params.py's last line (one per
    format, joined); raises Failure. zoo_module: with zoo_dir, the Python file whose
    ZOO builds the reference's models (tests/zoo/sweep_torchvision.py), not
    tests/zoo/zoo.py. zoo_formats: which of gen_zoo.py's files spmd reads, each
    trained against the one reference (pt: TorchScript; pt2, core.pt2:
    torch.export programs, without --input flags). reference_cache: a folder
    keeping DDP's results across runs (see reference)."""
    tools = {t: os.path.join(bin_dir, t) for t in TOOLS}
    missing = [t for t, path in tools.items() if not os.access(path, os.X_OK)]
    if missing:
        raise Failure("missing " + ", ".join(os.path.join(bin_dir, t) for t in missing) + " (not built?)")
    models = zoo_dir or os.path.join(ROOT, "samples")
    model = os.path.join(models, case.sample + ".pt")
    optimizer = shlex.split(case.optimizer)
    data, ref = os.path.join(tmp, "data.pt"), os.path.join(tmp, "ref.pt")

    kept = reference([python, os.path.join(HERE, "ddp_reference.py"), "--sample", case.sample, *optimizer,
                      "--nproc", str(case.nproc), "--steps", str(case.steps), "--data", data, "--out", ref,
                      "--seed", str(case.seed), "--model-pt", model, *shlex.split(case.extra),
                      *(["--zoo"] if zoo_dir else []), *(["--zoo-module", zoo_module] if zoo_module else [])],
                     tmp, timeout, reference_cache)
    summaries = []
    for fmt in (zoo_formats if zoo_dir else ("pt",)):
        if fmt != "pt" and (unexportable := export_refusal(case, models)):
            summaries.append(f"{fmt}: {unexportable}")
            continue
        try:
            summaries.append(run_spmd(case, tools, python, tmp, timeout, models, fmt, data, ref))
        except Failure as f:
            if len(zoo_formats) > 1 or fmt != "pt":
                f.reason = f"{case.sample}.{fmt}: {f.reason}"
            raise
    return ("DDP's results kept from an earlier run; " if kept else "") + "; ".join(summaries)


def reference(argv, tmp, timeout, cache):
    """Runs ddp_reference.py's argv, which writes its files (the data and the
    reference's parameters, losses and buffers) into the empty folder tmp. With
    cache, a folder, first looks for them there under a key of everything they
    follow from: the command line but the folder, the text of ddp_reference.py
    and of the model code it imports, the model file, and the python's torch and
    torchvision versions. DDP's results do not depend on spmd, so a changed spmd
    reuses them and a changed model or torch does not. Returns whether they
    came from the cache."""
    if cache is None:
        run(argv, timeout, what="ddp_reference.py")
        return False
    key = hashlib.sha256(" ".join(a.replace(tmp, "TMP") for a in argv[1:]).encode())
    model = argv[argv.index("--model-pt") + 1]
    zoo_module = argv[argv.index("--zoo-module") + 1] if "--zoo-module" in argv else None
    for source in (argv[1], os.path.join(ROOT, "samples", "models.py"), os.path.join(ROOT, "tests", "zoo", "zoo.py"),
                   zoo_module, model):
        if source:
            with open(source, "rb") as f:
                key.update(f.read())
    key.update(torch_versions(argv[0]).encode())
    kept = os.path.join(cache, key.hexdigest()[:32])
    if not os.path.isdir(kept):
        run(argv, timeout, what="ddp_reference.py")
        os.makedirs(cache, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".new-", dir=cache)
        for name in os.listdir(tmp):
            if name.endswith(".pt"):  # not the rendezvous's file store
                shutil.copy(os.path.join(tmp, name), staging)
        try:
            os.rename(staging, kept)
        except OSError:  # another run kept the same reference first
            shutil.rmtree(staging, ignore_errors=True)
        return False
    for name in os.listdir(kept):
        shutil.copy(os.path.join(kept, name), tmp)
    return True


_versions = {}


def is_this_python(python):
    """Whether python is the interpreter running this file (then torch is
    imported here, once, instead of in a process of its own)."""
    return os.path.realpath(python) == os.path.realpath(sys.executable)


def torch_versions(python):
    """The torch and torchvision versions python imports (asked once per python)."""
    if python not in _versions and is_this_python(python):
        import torch
        import torchvision
        _versions[python] = f"{torch.__version__} {torchvision.__version__}"
    if python not in _versions:
        _versions[python] = run([python, "-c", "import torch, torchvision; print(torch.__version__, "
                                 "torchvision.__version__)"], 120, what=python).decode().strip()
    return _versions[python]


# Zoo models torch.export (2.6) cannot export, whatever spmd does: in their
# forward nn.TransformerEncoder checks its mask on the data (a data-dependent
# guard). gen_zoo.py writes NAME.pt2.error for them instead of the programs.
UNEXPORTABLE = {"transformer_encoder_lm", "transformer_seq2seq"}


def export_refusal(case, models):
    """For a model of UNEXPORTABLE, torch.export's recorded refusal; raises
    Failure where the refusal and the list disagree."""
    error = os.path.join(models, case.sample + ".pt2.error")
    refused = os.path.exists(error)
    if refused != (case.sample in UNEXPORTABLE):
        raise Failure(f"{case.sample}: torch.export " + ("refused it, and UNEXPORTABLE does not list it: "
                                                          + open(error).read().strip() if refused else
                                                          "exported it: take it off UNEXPORTABLE"))
    return "torch.export cannot export it (" + open(error).read().strip()[:120] + ")" if refused else None


def run_spmd(case, tools, python, tmp, timeout, models, fmt, data, ref):
    """spmd's pipeline and run for one case on the model file NAME.fmt; compares with ref."""
    with open(os.path.join(models, case.sample + ".inputs")) as f:
        inputs = shlex.split(f.read())
    optimizer, extra = shlex.split(case.optimizer), shlex.split(case.extra)
    shard = ["--shard", case.shard, "--world-size", str(case.nproc)] if case.shard else []
    ours, step = os.path.join(tmp, f"ours.{fmt}.pt"), os.path.join(tmp, f"step.{fmt}.spmd")
    if case.name.startswith("export_"):
        dump = os.path.join(tmp, "exported.json")
        run([python, os.path.join(HERE, "export_step.py"), "--sample", case.sample, *optimizer, "--out", dump], timeout,
            what="export_step.py", env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        graph = run([tools["spmd-split"], dump, *extra, *shard], timeout)
        lower(case, tools, graph, step, timeout)
    else:
        source = os.path.join(models, case.sample + "." + fmt)
        if case.program:
            source, inputs = os.path.join(ROOT, case.program), []
        elif fmt != "pt":
            inputs = []
        if case.unroll:
            # The four stages in one process: spmd-compile writes the artifact
            # the tools piped write, byte for byte (CTest cli.compile checks that).
            run([tools["spmd-compile"], source, *inputs, *optimizer, *extra, *shard, "--iters", str(case.steps),
                 "-o", step], timeout)
        else:
            graph = run([tools["spmd-expand"], source, *inputs, *optimizer], timeout)
            lower(case, tools, run([tools["spmd-split"], *extra, *shard], timeout, stdin=graph), step, timeout)
    # One intra-op thread a rank, as ddp_reference.py sets: oneDNN's convolution
    # backward sums in an order that follows the thread count on some CPUs
    # (AVX-512: resnet18's parameters then differ by up to 2e-3 after the case's steps).
    run([tools["spmd-run"], step, "--nproc", str(case.nproc), "--steps", str(case.steps), "--data", data,
         "--save-params", ours, "--device", "cpu"], timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return compare(ours, ref, tolerance(case), python, timeout)


def lower(case, tools, graph, step, timeout):
    """spmd-unroll (for the cases run unrolled: the last bucket's update moved
    into the next iteration) and spmd-lower of spmd-split's output graph."""
    if case.unroll:
        graph = run([tools["spmd-unroll"], "--iters", str(case.steps)], timeout, stdin=graph)
    run([tools["spmd-lower"], "-o", step], timeout, stdin=graph)


def compare(ours, ref, tol, python, timeout):
    """compare_params.py's last line for ours against ref; raises Failure on a
    mismatch. In this process when it runs the reference's python (torch is
    then imported once, not once a case), else through compare_params.py."""
    if is_this_python(python):
        import io
        import torch
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        import compare_params
        out = io.StringIO()
        try:
            bad = compare_params.compare(compare_params.as_dict(torch.load(ours, map_location="cpu"), ours),
                                         compare_params.as_dict(torch.load(ref, map_location="cpu"), ref),
                                         tol[0], tol[1], out)
        except Exception as e:  # unreadable or not a dict of tensors
            raise Failure(f"compare_params: {e}")
        report, failed = out.getvalue(), bad != 0
    else:
        try:
            proc = subprocess.run([python, os.path.join(HERE, "compare_params.py"), ours, ref,
                                   "--rtol", str(tol[0]), "--atol", str(tol[1])],
                                  cwd=ROOT, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"compare_params.py timed out after {timeout}s")
        report, failed = (proc.stdout + proc.stderr).decode(errors="replace"), proc.returncode != 0
    if failed:
        last = report.strip().splitlines()[-1] if report.strip() else "no report"
        raise Failure("parameters differ from DDP's: " + last, report)
    return report.strip().splitlines()[-1] if report.strip() else ""


def indent(text, limit=60):
    lines = text.rstrip().splitlines()
    if len(lines) > limit:
        lines = lines[:limit // 2] + [f"... ({len(lines) - limit} lines left out)"] + lines[-limit // 2:]
    return "".join("    " + line + "\n" for line in lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bin_dir", nargs="?", help="folder with spmd-expand, spmd-split, spmd-lower, spmd-run")
    p.add_argument("--case", action="append", default=[], metavar="NAME", help="run only this case (repeatable)")
    p.add_argument("--strict", action="store_true", help="also run the strict (rounding-sensitive) cases")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--keep", action="store_true", help="keep every case's temporary folder")
    p.add_argument("--python", default=default_python(), help="python that imports torch (/usr/bin/python3)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per command (300)")
    p.add_argument("--shard", choices=["optimizer", "gradients", "parameters"],
                   help="run the chosen cases with spmd-split --shard MODE --world-size NPROC")
    p.add_argument("--sharded", action="store_true",
                   help="run the sharded cases (spmd-split --shard) instead of the others")
    p.add_argument("--zoo", metavar="DIR", help="run the zoo's cases, on tests/zoo/gen_zoo.py's files in DIR")
    p.add_argument("--reference-cache", metavar="DIR",
                   help="keep DDP's results in DIR and reuse them while the reference's inputs are the same")
    p.add_argument("--tier", choices=["core", "long"],
                   help="only make test's cases (core) or only the others (long); default every case")
    p.add_argument("--format", action="append", choices=["pt", "pt2", "core.pt2"],
                   help="with --zoo: spmd reads NAME.pt (TorchScript, the default), NAME.pt2 or NAME.core.pt2 "
                        "(torch.export); repeat it to train each against one DDP reference")
    a = p.parse_args()
    all_cases = ZOO_CASES if a.zoo else CASES

    if a.list:
        for c in all_cases:
            print(f"{c.name}{' (strict)' if c.strict else ''}: {c.sample} {c.optimizer} --nproc {c.nproc} "
                  f"--steps {c.steps} --seed {c.seed}{' ' + c.extra if c.extra else ''}"
                  f"{' --shard ' + c.shard if c.shard else ''}")
        return 0
    if not a.bin_dir:
        p.error("BIN_DIR is required")
    by_name = {c.name: c for c in all_cases}
    unknown = [n for n in a.case if n not in by_name]
    if unknown:
        p.error(f"unknown case {', '.join(unknown)} (have: {', '.join(by_name)})")
    cases = [by_name[n] for n in a.case] if a.case else [c for c in all_cases if (a.strict or not c.strict) and
                                                         bool(c.shard) == a.sharded]
    if a.tier:
        cases = [c for c in cases if (c.name in CORE_CASES) == (a.tier == "core")]
    if a.shard:
        cases = [c._replace(shard=a.shard) for c in cases]
    if a.zoo and a.format == ["core.pt2"]:
        # Core ATen decomposes LayerNorm, softmax, GELU and BatchNorm into ops
        # that round otherwise than eager's kernels, which Adam at eps 1e-8
        # would amplify: SGD, within 1e-4.
        cases = [c._replace(optimizer=ZOO_SGD, **NEAR) for c in cases]
    bin_dir = os.path.abspath(a.bin_dir)

    passed = failed = 0
    for case in cases:
        tmp = tempfile.mkdtemp(prefix=f"spmd-parity-{case.name}-")
        start = time.monotonic()
        try:
            summary = run_case(case, bin_dir, a.python, tmp, a.timeout, a.zoo and os.path.abspath(a.zoo),
                               zoo_formats=tuple(a.format or ["pt"]),
                               reference_cache=a.reference_cache and os.path.abspath(a.reference_cache))
        except Failure as f:
            failed += 1
            if os.listdir(tmp):
                where = f" (files in {tmp})"
            else:
                where = ""
                os.rmdir(tmp)
            print(f"FAIL {case.name}: {f.reason}{where}")
            if f.details.strip():
                sys.stdout.write(indent(f.details))
            sys.stdout.flush()
            continue
        passed += 1
        print(f"PASS {case.name} ({time.monotonic() - start:.1f}s; {summary})", flush=True)
        if a.keep:
            print(f"    files in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
