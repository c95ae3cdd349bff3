"""Which of torchvision's classification models spmd trains like DDP: a sweep
over the smallest variant of every family (a tool, not run in CI).

  tools/platform.sh run env PYTORCH_TENSOREXPR=0 python3 tests/zoo/sweep_torchvision.py \\
      build [--only NAME ...] [--list] [--out RESULTS.md] [--timeout S] [--keep]

The families are torchvision.models.list_models(module=torchvision.models)
grouped by name with the variant left out (resnet18..152 -> resnet,
regnet_y_400mf..128gf -> regnet_y, vgg11_bn..vgg19_bn -> vgg_bn,
efficientnet_v2_s..l -> efficientnet_v2, ...); each family's variant with the
fewest parameters (as its ImageNet weights' metadata counts them) is swept. Each
is built with num_classes=64 (googlenet and inception_v3 with
aux_logits=False, init_weights=False), dropout and stochastic depth 0
(zoo.no_dropout), wrapped in zoo.Classify, at the smallest image size of
32, 48, 64, 75, 96, ..., 224 whose forward runs in eager (ViTs built with
image_size= that size; batch 4 per rank, 2 from 128 pixels up); gen_zoo.write traces it, and
tests/parity/run_parity.py's run_case runs DDP (ddp_reference.py, through
--zoo-module this file) and spmd-expand | spmd-split | spmd-unroll |
spmd-lower, spmd-run: SGD with momentum (the zoo's), 2 steps, 2 ranks,
compared to 1e-4. Models run one at a time, fewest parameters first.

It prints a line per model and writes a Markdown table (model, image size,
parameters, PASS/FAIL, the stage that failed, the error's line, seconds) to
--out (/tmp/sweep_results.md), rewritten after every model, so a sweep cut
off keeps what it has. A failing model's folder is kept and named.

Time: about 20-40 minutes for the ~23 families on 2 CPU cores (the choice of
models and sizes takes ~1 minute; small CNNs take 20-60 s each, vgg11,
vit_b_16, wide_resnet50_2 and maxvit_t at 224 pixels several minutes each).

The reference's ranks rebuild the models from this file's ZOO, which reads
the plan (models, sizes, builder arguments) that the sweep writes to
$SPMD_SWEEP_PLAN; without it ZOO is empty.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

import torch
import torchvision
import torchvision.models as tvm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))

from zoo import CLASSES, Classify, images  # noqa: E402

SIZES = [32, 48, 64, 75, 96, 112, 128, 160, 192, 224]
SIZE_WORDS = {"t", "s", "m", "b", "l", "h", "tiny", "small", "base", "large"}
# Builder arguments beyond num_classes: no auxiliary heads (their losses are
# not in the returned logits), and PyTorch's default init, not scipy's.
EXTRA_KWARGS = {"googlenet": {"aux_logits": False, "init_weights": False},
                "inception_v3": {"aux_logits": False, "init_weights": False}}


def family(name):
    """resnet18 -> resnet, regnet_y_400mf -> regnet_y, vgg11_bn -> vgg_bn,
    efficientnet_v2_s -> efficientnet_v2, mobilenet_v3_small -> mobilenet_v3,
    shufflenet_v2_x0_5 -> shufflenet_v2_x, vit_b_16 -> vit."""
    kept = []
    for token in name.split("_"):
        if re.fullmatch(r"v\d+", token):
            kept.append(token)
            continue
        if token in SIZE_WORDS:
            continue
        stem = re.match(r"[a-z]*", token).group(0)
        if stem:
            kept.append(stem)
    return "_".join(kept)


def kwargs_of(name):
    return dict(num_classes=CLASSES, **EXTRA_KWARGS.get(name, {}))


def imagenet_params(name):
    """The parameter count torchvision's weights record (1000 classes)."""
    return tvm.get_model_weights(name).DEFAULT.meta["num_params"]


def smallest_size(name):
    """(the smallest of SIZES whose train-mode forward runs in eager or None,
    the builder's arguments, the parameter count with 64 classes). ViTs are
    built for the size (image_size=), the others take any size they can."""
    kwargs = kwargs_of(name)
    model = None
    for size in SIZES:
        if name.startswith("vit_"):
            kwargs = dict(kwargs_of(name), image_size=size)
            model = None
        torch.manual_seed(0)
        model = model or tvm.get_model(name, **kwargs).train()
        try:
            with torch.no_grad():
                model(torch.randn(batch_for(size), 3, size, size))
            return size, kwargs, sum(p.numel() for p in model.parameters())
        except Exception:
            continue
    return None, kwargs, sum(p.numel() for p in model.parameters())


def batch_for(size):
    return 4 if size < 128 else 2


def plan_models(only=()):
    """{name: {builder, kwargs, size, batch, params, family}}, the smallest per family."""
    best = {}
    for name in tvm.list_models(module=torchvision.models):
        fam, n = family(name), imagenet_params(name)
        if fam not in best or n < best[fam][1]:
            best[fam] = (name, n)
    if only:
        best = {family(o): (o, imagenet_params(o)) for o in only}
    plan = {}
    for fam, (name, _) in sorted(best.items(), key=lambda kv: kv[1][1]):
        size, kwargs, n = smallest_size(name)
        plan[name] = {"builder": name, "kwargs": kwargs, "size": size,
                      "batch": batch_for(size) if size else None, "params": n, "family": fam}
        print(f"plan: {name} ({fam}): {n / 1e6:.2f}M parameters, image size {size}", flush=True)
    return plan


def zoo_of(plan):
    """zoo.ZOO's shape: {name: (constructor, input specs)}."""
    def constructor(entry):
        return lambda: Classify(tvm.get_model(entry["builder"], **entry["kwargs"]))
    return {name: (constructor(e), images(batch=e["batch"], size=e["size"]))
            for name, e in plan.items() if e["size"]}


PLAN = os.environ.get("SPMD_SWEEP_PLAN")
ZOO = zoo_of(json.load(open(PLAN))) if PLAN and os.path.exists(PLAN) else {}


def one_line(details, reason):
    """The line of a tool's output that says what went wrong."""
    lines = [l.strip() for l in details.splitlines() if l.strip()]
    exc = [l for l in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*:", l)]
    if exc:
        return exc[-1]
    err = [l for l in lines if re.search(r"error|fail|abort|terminate", l, re.I)]
    if err:
        return err[0]
    return lines[-1] if lines else reason


def stage_of(reason):
    if reason.startswith("parameters differ"):
        return "parity"
    word = reason.split()[0] if reason else "?"
    return word + (" (timeout)" if "timed out" in reason else "")


def write_table(path, rows, started, done):
    with open(path, "w") as f:
        f.write(f"# torchvision {torchvision.__version__} classification sweep (torch {torch.__version__})\n\n")
        f.write(f"Started {started}; {'finished' if done else 'in progress / cut off'}. "
                "SGD momentum 0.9 lr 0.01, 2 steps, 2 ranks, num_classes=64, rtol 1e-4 atol 1e-6.\n\n")
        f.write("| model | family | params | image | batch/rank | result | stage | error | seconds |\n")
        f.write("|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            err = r["error"].replace("|", "\\|")[:240]
            f.write(f"| {r['name']} | {r['family']} | {r['params'] / 1e6:.2f}M | {r['size']} | {r['batch']} | "
                    f"{r['result']} | {r['stage']} | {err} | {r['seconds']:.0f} |\n")


def main():
    import gen_zoo
    import run_parity
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bin_dir", help="folder with spmd-expand, spmd-split, spmd-unroll, spmd-lower, spmd-run")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="sweep only this model (repeatable)")
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    p.add_argument("--out", default="/tmp/sweep_results.md", help="the Markdown table (/tmp/sweep_results.md)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per command (600)")
    p.add_argument("--keep", action="store_true", help="keep every model's folder")
    a = p.parse_args()
    os.environ.setdefault("PYTORCH_TENSOREXPR", "0")

    work = tempfile.mkdtemp(prefix="spmd-sweep-")
    plan = plan_models(a.only)
    plan_path = os.path.join(work, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f, indent=1)
    if a.list:
        return 0
    os.environ["SPMD_SWEEP_PLAN"] = plan_path  # read by the reference's ranks (this file's ZOO)
    zoo = zoo_of(plan)
    models = os.path.join(work, "models")
    bin_dir, python = os.path.abspath(a.bin_dir), run_parity.default_python()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rows = []
    for name, e in plan.items():
        row = dict(name=name, family=e["family"], params=e["params"], size=e["size"], batch=e["batch"],
                   result="PASS", stage="", error="", seconds=0.0)
        start = time.monotonic()
        tmp = os.path.join(work, name)
        os.makedirs(tmp)
        try:
            if not e["size"]:
                raise run_parity.Failure("eager: no image size of %s runs" % SIZES)
            try:
                gen_zoo.write(models, [name], zoo)
            except Exception as ex:
                raise run_parity.Failure("trace failed", f"{type(ex).__name__}: {ex}")
            case = run_parity.Case(name, name, run_parity.ZOO_SGD, 2, 2, "", 1, False)
            summary = run_parity.run_case(case, bin_dir, python, tmp, a.timeout, models, os.path.abspath(__file__))
            row["error"] = summary
        except run_parity.Failure as f:
            row.update(result="FAIL", stage=stage_of(f.reason), error=one_line(f.details, f.reason))
            with open(os.path.join(tmp, "failure.txt"), "w") as out:
                out.write(f.reason + "\n" + f.details)
        row["seconds"] = time.monotonic() - start
        rows.append(row)
        where = f" (files in {tmp})" if row["result"] == "FAIL" or a.keep else ""
        print(f"{row['result']} {name} {row['seconds']:.0f}s {row['stage']} {row['error']}{where}", flush=True)
        if row["result"] == "PASS" and not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        write_table(a.out, rows, started, done=False)
    write_table(a.out, rows, started, done=True)
    print(f"{sum(r['result'] == 'PASS' for r in rows)} passed, {sum(r['result'] == 'FAIL' for r in rows)} failed; "
          f"table in {a.out}; models in {models}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
