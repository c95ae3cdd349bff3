"""Turns bench.sh's results.jsonl into a markdown section for bench/RESULTS.md.

  python3 bench/report.py RESULTS.jsonl... [--append bench/RESULTS.md] [--ranks 2]

Prints (or appends) a heading with the date and machine; per model, one table per
precision (rows: GPU count x system; columns: median, min and max ms per step (wall),
device ms and kernels a step (from traces), peak memory, compile time, and spmd-run's
wall time, device time and peak memory as a ratio of the row's, at the same GPU count);
a table of spmd-run against torch.compile(DDP) and its max-autotune for every model and
precision; the scaling efficiency of each system (1-GPU step / N-GPU step) and
all_reduce's bus bandwidth (bench/allreduce.py) where the run has several GPU counts;
the targets of issues #6 and #14 marked met or MISSED with their numbers (at --ranks
GPUs, default the run's largest GPU count; only for the models and precisions the run
has); what the run skipped (its time budget, max-autotune that did not finish) and
every error it recorded. Several files (one run's models split over several bench.sh
calls) are read as one run, under the first file's machine. A line without a
"precision" (older runs) is fp32. Needs no torch: it only reads the JSON lines that
bench.sh, record.py, models.py and torch_step.py wrote.
"""
import argparse
import datetime
import json
import re

SYSTEMS = [("spmd", "spmd-run"), ("ddp", "DDP eager"), ("fsdp2", "FSDP2 eager"), ("compile", "torch.compile(DDP)"),
           ("reduce-overhead", "torch.compile(DDP) reduce-overhead (CUDA graphs)"),
           ("max-autotune", "torch.compile(DDP) max-autotune"),
           ("max-autotune-cudagraphs", "torch.compile(DDP) max-autotune (CUDA graphs)")]
LABEL = dict(SYSTEMS)
# the systems spmd-run is set against in the summary
COMPILED = ("compile", "reduce-overhead", "max-autotune", "max-autotune-cudagraphs")
PRECISIONS = ["fp32", "bf16"]  # the order of the tables' rows; others follow
MIB = 1024.0 * 1024.0
# Log lines that say why a command failed (the last line is often only a hint).
CAUSE = re.compile(r"\berror:|Error\b|No such file|not found|Killed|[Tt]imed? ?out|Aborted|Segmentation")


def precision_of(row):
    return row.get("precision") or "fp32"


def precision_order(names):
    return sorted(set(names), key=lambda p: (PRECISIONS.index(p) if p in PRECISIONS else len(PRECISIONS), p))


class Results:
    """The lines of one results.jsonl, by kind; runs and device times keyed (model, system, ranks,
    precision), pipelines (model, precision)."""

    def __init__(self, lines):
        self.machine, self.models, self.runs, self.pipelines, self.errors = {}, {}, {}, {}, []
        self.allreduces, self.compile_times, self.device_times, self.skips = [], {}, {}, []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                self.errors.append({"system": "results.jsonl", "what": "line %d is not JSON: %s" % (number, line[:80])})
                continue
            self.add(row)

    def add(self, row):
        kind = row.get("kind")
        if kind == "machine":
            self.machine = self.machine or row  # of several runs' files, the first's
        elif kind == "model":
            self.models[row["model"]] = row
        elif kind == "result":
            self.runs[(row["model"], row["system"], row["ranks"], precision_of(row))] = row
        elif kind == "pipeline":
            self.pipelines[(row["model"], precision_of(row))] = row
        elif kind == "allreduce":
            self.allreduces.append(row)
        elif kind == "compile_time":
            self.compile_times[(row["model"], precision_of(row))] = row
        elif kind == "device_time":
            self.device_times[(row["model"], row["system"], row["ranks"], precision_of(row))] = row
        elif kind == "skipped":
            self.skips.append(row)
        elif kind == "error":
            self.errors.append(row)

    def run(self, model, system, ranks, precision="fp32"):
        return self.runs.get((model, system, ranks, precision))

    def device_time(self, model, system, ranks, precision="fp32"):
        return self.device_times.get((model, system, ranks, precision))

    def systems(self):
        """The systems the run has a line of (a run, an error or a skip), in SYSTEMS' order;
        spmd, DDP and torch.compile where it has none."""
        seen = {s for _, s, _, _ in self.runs} | {e.get("system") for e in self.errors + self.skips}
        return [(s, label) for s, label in SYSTEMS if s in seen] or SYSTEMS[:3]

    def pipeline(self, model, precision="fp32"):
        return self.pipelines.get((model, precision))

    def model_names(self):
        names = list(self.models)
        return names + sorted({m for m, _, _, _ in self.runs} - set(names))

    def rank_counts(self, model=None):
        """The GPU counts of the runs (of model: also of its errors and skips)."""
        found = {r for m, _, r, _ in self.runs if model is None or m == model}
        if model is not None:
            found |= {e["ranks"] for e in self.errors + self.skips if e.get("model") == model and e.get("ranks")}
        return sorted(found)

    def precisions(self, model):
        """The precisions the run has for model (runs, pipelines, errors or skips), fp32 first."""
        found = [p for m, _, _, p in self.runs if m == model] + [p for m, p in self.pipelines if m == model]
        found += [e["precision"] for e in self.errors + self.skips if e.get("model") == model and e.get("precision")]
        return precision_order(found)

    def has(self, model, precision="fp32"):
        """Whether the run has model at precision (a run, a pipeline or an error of it), or has
        model with no precision at all (a model line, or an error of models.py) and precision is fp32."""
        found = self.precisions(model)
        if found:
            return precision in found
        return precision == "fp32" and (model in self.models or any(e.get("model") == model for e in self.errors))

    def failure(self, model, system, ranks, precision="fp32"):
        return self._about(self.errors, model, system, ranks, precision)

    def skipped(self, model, system, ranks, precision="fp32"):
        return self._about(self.skips, model, system, ranks, precision)

    @staticmethod
    def _about(rows, model, system, ranks, precision):
        """The first of rows (errors or skips) about system's run of model at ranks and precision."""
        for e in rows:
            if (e.get("model") == model and e.get("system") == system and e.get("ranks") in (ranks, None)
                    and e.get("precision") in (precision, None)):
                return e
        return None


def ms(value):
    return "—" if value is None else "%.3f" % value if value < 10 else "%.2f" % value


def mib(value):
    return "—" if not value else "%.0f" % (value / MIB)


def ratio(num, den):
    return num / den if num and den else None


def seconds(value):
    return "—" if value is None else "%.1f" % value


def times(value):
    return "—" if value is None else "%.2fx" % value


def heading(res):
    m = res.machine
    date = (m.get("date") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    lines = ["## %s — issue #6/#14/#39 benchmark: spmd-run beside DDP eager and torch.compile(DDP)"
             % date.split(" ")[0], ""]
    if m.get("gpus"):
        what = "%d x %s (driver %s), CUDA %s, NCCL %s" % (
            m["gpus"], m.get("gpu"), m.get("driver"), m.get("cuda"), m.get("nccl"))
    else:
        what = "CPU only (%s cores)" % m.get("host_cpus", "?")
    env = ", ".join("`%s=%s`" % kv for kv in sorted(m.get("env", {}).items()))
    lines.append("Machine: %s, torch %s%s; spmd at %s, run %s. Every system: fp32 parameters, TF32 matmuls on, "
                 "each model's optimizer; precision bf16: the forward under bf16 autocast."
                 % (what, m.get("torch", "?"), ", " + env if env else "", m.get("commit") or "?", date))
    lines += [""] + ["- %s" % n for n in m.get("notes", [])]
    return lines


def model_title(res, name):
    meta = res.models.get(name, {})
    any_run = next((r for (m, _, _, _), r in sorted(res.runs.items()) if m == name), {})
    parts = [meta.get("about", name)]
    if meta.get("params"):
        n = meta["params"]
        parts.append("%.1fM parameters" % (n / 1e6) if n >= 1e6 else "{:,} parameters".format(n))
    if meta.get("inputs"):
        parts.append("per rank " + ", ".join("`%s`" % i for i in meta["inputs"]))
    if meta.get("lr"):
        opt = meta.get("optimizer", "adam")
        parts.append("%s lr %g" % ({"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}.get(opt, opt), meta["lr"])
                     + (" momentum %g" % meta["momentum"] if meta.get("momentum") else ""))
    if meta.get("torchscript"):
        how = "TorchScript traced" if meta["torchscript"] == "trace" else "TorchScript scripted"
        parts.append(how + (" in %.1f s" % meta["export_s"] if meta.get("export_s") is not None else ""))
    if any_run:
        parts.append("%s timed steps after %s warm-up" % (any_run.get("steps"), any_run.get("warmup")))
    return "### %s — %s" % (name, "; ".join(parts))


def compile_warmups(res, name, rank_counts, precision="fp32"):
    """torch.compile's first steps (which compile), e.g. '26.9 s at 1 GPU, 24.3 s at 2 GPUs'."""
    rows = [res.run(name, "compile", r, precision) for r in rank_counts]
    done = [w for w in rows if w and w.get("compile_s")]
    return ", ".join("%.1f s at %s" % (w["compile_s"], gpus(w["ranks"])) for w in done) or "—"


PRECISION_TITLE = {"fp32": "fp32 (TF32 matmuls)", "bf16": "bf16 autocast"}


def compile_seconds(res, name, system, ranks, precision):
    """spmd's pipeline (median, wall) or torch.compile's first step; None for DDP eager."""
    if system == "spmd":
        pipe = res.pipeline(name, precision)
        return pipe and pipe["median_s"]
    row = res.run(name, system, ranks, precision)
    return row and row.get("compile_s")


def missing(res, name, system, ranks, precision):
    """Why a system has no row: failed or skipped (the Errors and Skipped lists say why), or not run."""
    if res.failure(name, system, ranks, precision):
        return "failed"
    return "skipped" if res.skipped(name, system, ranks, precision) else "not run"


def tables(res, name):
    """One table per precision of model name, then its compile-time and PyTorch notes."""
    lines, warm_included = [], False
    precisions = res.precisions(name) or ["fp32"]
    for precision in precisions:
        rows, included = precision_table(res, name, precision)
        lines += ["", "#### %s, %s" % (name, PRECISION_TITLE.get(precision, precision)), ""] + rows
        lines += first_losses(res, name, precision)
        warm_included = warm_included or included
    if warm_included:
        lines += ["", "\\* spmd-run's timings include the warm-up steps (this spmd-run has no `--warmup`)."]
    for precision in precisions:
        lines += compile_time_table(res.compile_times.get((name, precision)))
    ran = torch_settings(res, name, precisions)
    return lines + ([""] + ["PyTorch ran with: " + "; ".join(ran) + "."] if ran else [])


def precision_table(res, name, precision):
    """(lines, whether a spmd-run row includes its warm-up): a row per GPU count and system;
    the ratio columns are spmd-run's value over the row's (below 1.00x: spmd-run's is less)."""
    lines = ["| GPUs | system | median ms | min ms | max ms | device ms | kernels | peak MiB | compile s "
             "| spmd / this: wall | device | peak |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    warm_included = False
    for ranks in res.rank_counts(name) or [1]:
        spmd = res.run(name, "spmd", ranks, precision) or {}
        spmd_device = res.device_time(name, "spmd", ranks, precision) or {}
        for system, label in res.systems():
            row = res.run(name, system, ranks, precision)
            if row is None:
                lines.append("| %d | %s | %s |%s" % (ranks, label, missing(res, name, system, ranks, precision),
                                                     " — |" * 9))
                continue
            if row.get("warmup_excluded") is False:
                label, warm_included = label + " *", True
            device = res.device_time(name, system, ranks, precision) or {}
            mine = system == "spmd"
            lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                ranks, label, ms(row["median_ms"]), ms(row["min_ms"]), ms(row["max_ms"]),
                ms(device.get("device_ms")), "—" if device.get("kernels") is None else "%.1f" % device["kernels"],
                mib(row.get("peak_bytes")), seconds(compile_seconds(res, name, system, ranks, precision)),
                "—" if mine else times(ratio(spmd.get("median_ms"), row["median_ms"])),
                "—" if mine else times(ratio(spmd_device.get("device_ms"), device.get("device_ms"))),
                "—" if mine else times(ratio(spmd.get("peak_bytes"), row.get("peak_bytes")))))
    return lines, warm_included


def first_losses(res, name, precision):
    """The first steps' losses of each system at the smallest GPU count: from the same weights on the
    same batch they agree up to rounding, so where they part the step's numerics differ."""
    ranks = min(res.rank_counts(name) or [1])
    parts = []
    for system, label in res.systems():
        head = (res.run(name, system, ranks, precision) or {}).get("losses_head")
        if head:
            parts.append("%s %s" % (label, ", ".join("%.4g" % x for x in head)))
    return ["", "First steps' losses (%s): %s." % (gpus(ranks), "; ".join(parts))] if parts else []


def against_compile(res):
    """spmd-run over torch.compile(DDP) and its max-autotune, for every model, precision and GPU
    count that has both rows: wall and device time a step, kernels, peak memory, compile time."""
    lines = []
    for name in res.model_names():
        for precision in res.precisions(name):
            for ranks in res.rank_counts(name):
                lines += [against_line(res, name, system, ranks, precision) for system in COMPILED
                          if res.run(name, "spmd", ranks, precision) and res.run(name, system, ranks, precision)]
    if not lines:
        return []
    return ["### spmd-run / torch.compile(DDP) (below 1.00x: spmd-run's is less)", "",
            "| model | precision | GPUs | against | wall a step | device time a step | kernels a step "
            "| peak memory | compile time |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"] + lines + [""]


def against_line(res, name, system, ranks, precision):
    spmd, other = res.run(name, "spmd", ranks, precision), res.run(name, system, ranks, precision)
    mine = res.device_time(name, "spmd", ranks, precision) or {}
    theirs = res.device_time(name, system, ranks, precision) or {}
    return "| %s | %s | %d | %s | %s | %s | %s | %s | %s |" % (
        name, precision, ranks, LABEL[system], times(ratio(spmd["median_ms"], other["median_ms"])),
        times(ratio(mine.get("device_ms"), theirs.get("device_ms"))),
        times(ratio(mine.get("kernels"), theirs.get("kernels"))),
        times(ratio(spmd.get("peak_bytes"), other.get("peak_bytes"))),
        times(ratio(compile_seconds(res, name, "spmd", ranks, precision), other.get("compile_s"))))


# Stages that read no weights: issue #18 wants each under this.
NO_WEIGHT_STAGES, NO_WEIGHT_LIMIT_S, COPY_RATIO_LIMIT = ("split", "unroll"), 0.3, 2.0


def compile_time_table(row):
    """bench/compile_time.sh's medians: each stage alone, the piped pipeline, and the model file's copy."""
    if not row:
        return []
    lines = ["", "Compile time (`bench/compile_time.sh`, %s, model file %.0f MB, medians of %d runs, page cache warm):"
             % (row["precision"], row["model_bytes"] / 1e6, len(row["pipeline_runs_s"])), "",
             "| what | seconds |", "| --- | ---: |",
             "| read the model file and write a copy (`cat`) | %.3f |" % row["copy_s"],
             "| tool start-up (`spmd-split --help`: loading LibTorch) | %.3f |" % row["startup_s"]]
    for name, stage in row["stages"].items():
        lines.append("| spmd-%s alone | %.3f |" % (name, stage["median_s"]))
    lines.append("| the four piped (`expand \\| split \\| unroll \\| lower`) | %.3f |" % row["pipeline_s"])
    lines.append("| pipeline / copy | %.2fx |" % row["ratio_to_copy"])
    if "compile_s" in row:
        lines.append("| `spmd-compile` (the four stages in one process) | %.3f |" % row["compile_s"])
    return lines


def compile_time_targets(res, model="gpt", precision="fp32"):
    row = res.compile_times.get((model, precision))
    if not row:
        return []
    lines = [Target("%s pipeline at most %gx reading and copying the model file" % (model, COPY_RATIO_LIMIT)).line(
        row["ratio_to_copy"] <= COPY_RATIO_LIMIT, "pipeline %.2f s / copy %.3f s = %.2fx" % (
            row["pipeline_s"], row["copy_s"], row["ratio_to_copy"]))]
    for name in NO_WEIGHT_STAGES:
        got = row["stages"].get(name, {}).get("median_s")
        lines.append(Target("%s: spmd-%s (reads no weights) under %g s" % (model, name, NO_WEIGHT_LIMIT_S)).line(
            None if got is None else got < NO_WEIGHT_LIMIT_S,
            "%s s (tool start-up alone %.3f s)" % ("—" if got is None else "%.3f" % got, row["startup_s"])))
    return lines


def torch_settings(res, name, precisions):
    """What torch_step.py's rows of model name ran with, by precision: attention (gpt), optimizer implementation."""
    out = []
    for precision in precisions:
        rows = [r for (m, sys, _, p), r in sorted(res.runs.items()) if m == name and p == precision and sys != "spmd"]
        parts = []
        for key, what in (("attention", "attention"), ("optimizer_impl", "optimizer implementation"),
                          ("autocast", "autocast")):
            seen = sorted({str(r[key]) for r in rows if r.get(key)})
            if seen:
                parts.append("%s %s" % (what, " / ".join(seen)))
        if parts:
            out.append("%s: %s" % (precision, ", ".join(parts)))
    return out


class Target:
    """One line of the Targets list: met or MISSED, with its numbers."""

    def __init__(self, text):
        self.text = text

    def line(self, met, numbers):
        if met is None:
            return "- **MISSED** (not measured) — %s: %s" % (self.text, numbers)
        return "- %s — %s: %s" % ("met" if met else "**MISSED**", self.text, numbers)


def median_ms(res, model, system, ranks, precision="fp32"):
    row = res.run(model, system, ranks, precision)
    return row["median_ms"] if row else None


def speed_target(res, model, ranks, least, text, aim=None, other="ddp", precision="fp32"):
    """Met when OTHER's step / spmd-run's step >= least (spmd-run least times faster)."""
    spmd, them = median_ms(res, model, "spmd", ranks, precision), median_ms(res, model, other, ranks, precision)
    r = ratio(them, spmd)
    numbers = "%s %s ms / spmd-run %s ms = %s (need >= %gx%s)" % (
        LABEL[other], ms(them), ms(spmd), times(r), least, ", aim %gx" % aim if aim else "")
    return Target(text).line(None if r is None else r >= least, numbers)


def within_target(res, model, ranks, most, text, aim=None, other="compile", precision="fp32"):
    """Met when spmd-run's step / OTHER's step <= most (spmd-run at most most times OTHER's time)."""
    spmd, them = median_ms(res, model, "spmd", ranks, precision), median_ms(res, model, other, ranks, precision)
    r = ratio(spmd, them)
    numbers = "spmd-run %s ms / %s %s ms = %s (need <= %gx%s)" % (
        ms(spmd), LABEL[other], ms(them), times(r), most, ", aim %gx" % aim if aim else "")
    return Target(text).line(None if r is None else r <= most, numbers)


def scaling_target(res, model, ranks):
    one, many = median_ms(res, model, "spmd", 1), median_ms(res, model, "spmd", ranks)
    r = ratio(many, one)
    numbers = "spmd-run %s ms at 1 GPU, %s ms at %d GPUs = %s (need <= 1.03x)" % (ms(one), ms(many), ranks, times(r))
    return Target("%s: spmd-run at %d GPUs within 3%% of 1 GPU" % (model, ranks)).line(
        None if r is None else r <= 1.03, numbers)


def compile_target(res, model, ranks, limit=2.0):
    pipe = res.pipeline(model)
    warm = compile_warmups(res, model, sorted({1, ranks}))
    got = pipe["median_s"] if pipe else None
    numbers = "spmd pipeline %s s (need < %g s); torch.compile warm-up %s" % (
        "—" if got is None else "%.2f" % got, limit, warm)
    return Target("%s compile pipeline under %g s" % (model, limit)).line(None if got is None else got < limit, numbers)


def memory_target(res, model, ranks, precision="fp32"):
    spmd, ddp = res.run(model, "spmd", ranks, precision), res.run(model, "ddp", ranks, precision)
    a, b = spmd and spmd.get("peak_bytes"), ddp and ddp.get("peak_bytes")
    numbers = "spmd-run %s MiB, DDP eager %s MiB" % (mib(a), mib(b))
    if a and b and a != b and mib(a) == mib(b):  # the rounding hides which is larger
        numbers += " (spmd-run %d bytes %s)" % (abs(a - b), "more" if a > b else "less")
    what = model if precision == "fp32" else "%s %s" % (model, precision)
    return Target("%s peak memory at %s no more than DDP eager's" % (what, gpus(ranks))).line(
        None if not a or not b else a <= b, numbers)


# Issue #39: the models as people write them, each precision.
MODELS_39 = ("gpt", "llama", "hf_gpt2", "hf_llama", "vit_b_16", "resnet50")


def device_target(res, model, ranks, precision, most=0.9):
    """Met when spmd-run's device time a step is at most MOST times torch.compile(DDP)'s."""
    mine = (res.device_time(model, "spmd", ranks, precision) or {}).get("device_ms")
    theirs = (res.device_time(model, "compile", ranks, precision) or {}).get("device_ms")
    r = ratio(mine, theirs)
    numbers = "spmd-run %s ms / torch.compile(DDP) %s ms = %s (need <= %gx)" % (ms(mine), ms(theirs), times(r), most)
    return Target("%s %s at %s: device time at most %gx torch.compile(DDP)'s" % (
        model, precision, gpus(ranks), most)).line(None if r is None else r <= most, numbers)


def compile_memory_target(res, model, ranks, precision):
    """Met when spmd-run's peak memory is at most torch.compile(DDP)'s."""
    a = (res.run(model, "spmd", ranks, precision) or {}).get("peak_bytes")
    b = (res.run(model, "compile", ranks, precision) or {}).get("peak_bytes")
    numbers = "spmd-run %s MiB, torch.compile(DDP) %s MiB = %s" % (mib(a), mib(b), times(ratio(a, b)))
    return Target("%s %s at %s: peak memory at most torch.compile(DDP)'s" % (model, precision, gpus(ranks))).line(
        None if not a or not b else a <= b, numbers)


def targets(res, ranks):
    """Issue #6's targets, then issue #14's and #39's, for the models (and precisions) the run has;
    the others are named in one line at the end."""
    at = "at %s" % gpus(ranks)
    # (model, precision, make the line)
    wanted = [
        ("mlp", "fp32", lambda: speed_target(
            res, "mlp", ranks, 5, "seeds' MLP %s: spmd-run at least 5x faster than DDP eager" % at, 10)),
        ("mlp4096", "fp32", lambda: speed_target(
            res, "mlp4096", ranks, 0.97, "mlp4096 %s: spmd-run no slower than 0.97x DDP eager" % at)),
        ("mlp4096", "fp32", lambda: scaling_target(res, "mlp4096", ranks) if ranks > 1 else None),
        ("gpt", "fp32", lambda: speed_target(res, "gpt", ranks, 1.0, "gpt %s: spmd-run no slower than DDP eager" % at)),
        ("gpt", "fp32", lambda: compile_target(res, "gpt", ranks)),
        # issue #14
        ("gpt", "fp32", lambda: within_target(
            res, "gpt", ranks, 1.0, "gpt fp32/TF32 %s: spmd-run no slower than torch.compile(DDP)" % at, 0.9)),
        ("gpt", "bf16", lambda: within_target(
            res, "gpt", ranks, 1.3, "gpt bf16 %s: spmd-run within 1.3x torch.compile(DDP) with autocast and SDPA" % at,
            precision="bf16")),
    ]
    for precision, label in (("fp32", "fp32/TF32"), ("bf16", "bf16")):
        for other in ("ddp", "compile"):
            wanted.append(("resnet50", precision, lambda p=precision, lb=label, o=other: speed_target(
                res, "resnet50", ranks, 1.05, "resnet50 %s %s: spmd-run at least 1.05x faster than %s"
                % (lb, at, LABEL[o]), other=o, precision=p)))
    for model in ("mlp", "mlp4096", "gpt", "resnet50"):
        for precision in res.precisions(model) or ["fp32"]:
            wanted.append((model, precision, lambda m=model, p=precision: memory_target(res, m, ranks, p)))
    for model in MODELS_39:
        for precision in res.precisions(model) or ["fp32"]:
            wanted.append((model, precision, lambda m=model, p=precision: device_target(res, m, ranks, p)))
            wanted.append((model, precision, lambda m=model, p=precision: compile_memory_target(res, m, ranks, p)))
    lines, left_out = ["### Targets", ""] + compile_time_targets(res), []
    for model, precision, make in wanted:
        if not res.has(model, precision):
            left_out.append("%s %s" % (model, precision))
            continue
        line = make()
        if line:
            lines.append(line)
    if left_out:
        lines += ["", "Not in this run, so not judged: targets for %s." % ", ".join(sorted(set(left_out)))]
    return lines


def gpus(n):
    return "%d GPU%s" % (n, "" if n == 1 else "s")


def cause(log_tail):
    """The log lines that name the failure (at most 3; not the empty input later stages of a
    pipeline saw), else the last line."""
    lines = [t.strip() for t in log_tail if t.strip()]
    named = [t for t in lines if CAUSE.search(t)]
    # In a pipeline the stages after the failing one only report its empty output.
    named = [t for t in named if not t.endswith("<stdin>: empty input")] or named
    return [t[:200] for t in (named[-3:] or lines[-1:])]


def skips(res):
    """What the run did not run (its budget), or cut off (max-autotune), and why; no failures."""
    if not res.skips:
        return []
    lines = ["### Skipped", ""]
    for e in res.skips:
        where = ", ".join(str(x) for x in (LABEL.get(e.get("system"), e.get("system")), e.get("model"),
                                           e.get("precision"), e.get("ranks") and gpus(e["ranks"])) if x)
        lines.append("- %s: %s" % (where, e.get("why")))
    return lines


def errors(res):
    if not res.errors:
        return []
    lines = ["### Errors", ""]
    for e in res.errors:
        where = ", ".join(str(x) for x in (LABEL.get(e.get("system"), e.get("system")), e.get("model"),
                                           e.get("precision"), e.get("ranks") and gpus(e["ranks"])) if x)
        why = " / ".join("`%s`" % t.replace("`", "'") for t in cause(e.get("log_tail", [])))
        lines.append("- %s: %s%s" % (where, e.get("what"), " — " + why if why else ""))
    return lines


def scaling(res):
    """Per model and system: 1-GPU step / N-GPU step (1.0 is perfect weak scaling)."""
    counts = sorted({r for _, _, r, _ in res.runs if r > 1})
    if not counts:
        return []
    lines = ["### Scaling efficiency (1-GPU step / N-GPU step, batch per GPU fixed)", "",
             "| model | system | precision | " + " | ".join(gpus(n) for n in counts) + " |",
             "| --- | --- | --- |" + " ---: |" * len(counts)]
    for name in res.model_names():
        for precision in res.precisions(name):
            for system, label in SYSTEMS:
                one = median_ms(res, name, system, 1, precision)
                cells = [ratio(one, median_ms(res, name, system, n, precision)) for n in counts]
                if all(c is None for c in cells):
                    continue
                lines.append("| %s | %s | %s | %s |" % (name, label, precision,
                                                        " | ".join("—" if c is None else "%.3f" % c for c in cells)))
    return lines + [""]


def allreduce_table(res):
    if not res.allreduces:
        return []
    lines = ["### all_reduce bus bandwidth (bench/allreduce.py, fp32 sum; busbw = algbw * 2(N-1)/N)", "",
             "| GPUs | MiB | median ms | algbw GB/s | busbw GB/s |", "| ---: | ---: | ---: | ---: | ---: |"]
    for row in sorted(res.allreduces, key=lambda r: (r["ranks"], r["bytes"])):
        lines.append("| %d | %g | %s | %.1f | %.1f |" % (row["ranks"], row["bytes"] / MIB, ms(row["median_ms"]),
                                                       row["algbw_gbps"], row["busbw_gbps"]))
    return lines + [""]


def section(res, ranks):
    lines = heading(res)
    for name in res.model_names():
        lines += ["", model_title(res, name)] + tables(res, name)
    lines += [""] + against_compile(res) + scaling(res) + allreduce_table(res) + targets(res, ranks)
    for part in (skips(res), errors(res)):
        lines += [""] + part if part else []
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+",
                   help="results.jsonl; several (one run's models split over several calls) are read as one run")
    p.add_argument("--append", metavar="FILE", help="append the section to FILE instead of printing it")
    p.add_argument("--ranks", type=int, help="GPU count the targets are judged at (default: the run's largest, else 2)")
    args = p.parse_args()
    lines = []
    for path in args.results:
        with open(path) as f:
            lines += f.readlines()
    res = Results(lines)
    text = section(res, args.ranks or max(res.rank_counts() or [2]))
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
