"""Turns bench.sh's results.jsonl into a markdown section for bench/RESULTS.md.

  python3 bench/report.py RESULTS.jsonl [--append bench/RESULTS.md] [--ranks 2]

Prints (or appends) a heading with the date and machine, one table per model (rows:
GPU count x precision x system; columns: precision, median, min, max ms per step,
peak memory, speed-up over DDP eager and over torch.compile(DDP) at the same GPU
count and precision), the scaling efficiency of each system (1-GPU step / N-GPU
step) and all_reduce's bus bandwidth (bench/allreduce.py) where the run has several
GPU counts, the targets of issues #6 and #14 marked met or MISSED with their
numbers (at --ranks GPUs, default the run's largest GPU count; only for the models
and precisions the run has), and every error the run recorded. A line without a
"precision" (older runs) is fp32. Needs no torch: it only reads the JSON lines that
bench.sh, record.py, models.py and torch_step.py wrote.
"""
import argparse
import datetime
import json
import re

SYSTEMS = [("spmd", "spmd-run"), ("ddp", "DDP eager"), ("compile", "torch.compile(DDP)")]
LABEL = dict(SYSTEMS)
PRECISIONS = ["fp32", "bf16"]  # the order of the tables' rows; others follow
MIB = 1024.0 * 1024.0
# Log lines that say why a command failed (the last line is often only a hint).
CAUSE = re.compile(r"\berror:|Error\b|No such file|not found|Killed|[Tt]imed? ?out|Aborted|Segmentation")


def precision_of(row):
    return row.get("precision") or "fp32"


def precision_order(names):
    return sorted(set(names), key=lambda p: (PRECISIONS.index(p) if p in PRECISIONS else len(PRECISIONS), p))


class Results:
    """The lines of one results.jsonl, by kind; runs keyed (model, system, ranks, precision),
    pipelines (model, precision)."""

    def __init__(self, lines):
        self.machine, self.models, self.runs, self.pipelines, self.errors = {}, {}, {}, {}, []
        self.allreduces, self.compile_times = [], {}
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
            self.machine = row
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
        elif kind == "error":
            self.errors.append(row)

    def run(self, model, system, ranks, precision="fp32"):
        return self.runs.get((model, system, ranks, precision))

    def pipeline(self, model, precision="fp32"):
        return self.pipelines.get((model, precision))

    def model_names(self):
        names = list(self.models)
        return names + sorted({m for m, _, _, _ in self.runs} - set(names))

    def rank_counts(self, model=None):
        return sorted({r for m, _, r, _ in self.runs if model is None or m == model})

    def precisions(self, model):
        """The precisions the run has for model (runs, pipelines or errors), fp32 first."""
        found = [p for m, _, _, p in self.runs if m == model] + [p for m, p in self.pipelines if m == model]
        found += [e["precision"] for e in self.errors if e.get("model") == model and e.get("precision")]
        return precision_order(found)

    def has(self, model, precision="fp32"):
        """Whether the run has model at precision (a run, a pipeline or an error of it), or has
        model with no precision at all (a model line, or an error of models.py) and precision is fp32."""
        found = self.precisions(model)
        if found:
            return precision in found
        return precision == "fp32" and (model in self.models or any(e.get("model") == model for e in self.errors))

    def failure(self, model, system, ranks, precision="fp32"):
        for e in self.errors:
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


def times(value):
    return "—" if value is None else "%.2fx" % value


def heading(res):
    m = res.machine
    date = (m.get("date") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    lines = ["## %s — issue #6/#14 benchmark: spmd-run beside DDP eager and torch.compile(DDP)" % date.split(" ")[0],
             ""]
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
    if meta.get("torchscript") == "trace":
        parts.append("TorchScript traced")
    if any_run:
        parts.append("%s timed steps after %s warm-up" % (any_run.get("steps"), any_run.get("warmup")))
    return "### %s — %s" % (name, "; ".join(parts))


def compile_warmups(res, name, rank_counts, precision="fp32"):
    """torch.compile's first steps (which compile), e.g. '26.9 s at 1 GPU, 24.3 s at 2 GPUs'."""
    rows = [res.run(name, "compile", r, precision) for r in rank_counts]
    done = [w for w in rows if w and w.get("compile_s")]
    return ", ".join("%.1f s at %s" % (w["compile_s"], gpus(w["ranks"])) for w in done) or "—"


def table(res, name):
    lines = ["| GPUs | system | precision | median ms | min ms | max ms | peak MiB | vs DDP eager | vs torch.compile |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    warm_included = False
    precisions = res.precisions(name) or ["fp32"]
    for ranks in res.rank_counts(name) or [1, 2]:
        for precision in precisions:
            ddp, comp = res.run(name, "ddp", ranks, precision), res.run(name, "compile", ranks, precision)
            for system, label in SYSTEMS:
                row = res.run(name, system, ranks, precision)
                if row is None:
                    status = "failed" if res.failure(name, system, ranks, precision) else "not run"
                    lines.append("| %d | %s | %s | %s | — | — | — | — | — |" % (ranks, label, precision, status))
                    continue
                if row.get("warmup_excluded") is False:
                    label, warm_included = label + " *", True
                lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    ranks, label, precision, ms(row["median_ms"]), ms(row["min_ms"]), ms(row["max_ms"]),
                    mib(row.get("peak_bytes")), times(ratio(ddp and ddp["median_ms"], row["median_ms"])),
                    times(ratio(comp and comp["median_ms"], row["median_ms"]))))
    if warm_included:
        lines += ["", "\\* spmd-run's timings include the warm-up steps (this spmd-run has no `--warmup`)."]
    notes = []
    for precision in precisions:
        at = "%s: " % precision if precisions != ["fp32"] else ""
        pipe = res.pipeline(name, precision)
        if pipe:
            notes.append("%sspmd pipeline (spmd-expand to spmd-lower, wall) %.2f s" % (at, pipe["median_s"])
                         + (" (median of %d)" % len(pipe["runs_s"]) if len(pipe["runs_s"]) > 1 else ""))
        warmups = compile_warmups(res, name, res.rank_counts(name), precision)
        if warmups != "—":
            notes.append("%storch.compile warm-up (first step, cold cache): %s" % (at, warmups))
    lines += [""] + ["Compile time: " + "; ".join(notes) + "."] if notes else []
    for precision in precisions:
        lines += compile_time_table(res.compile_times.get((name, precision)))
    ran = torch_settings(res, name, precisions)
    return lines + ([""] + ["PyTorch ran with: " + "; ".join(ran) + "."] if ran else [])


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


def targets(res, ranks):
    """Issue #6's targets, then issue #14's, for the models (and precisions) the run has;
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
    """The log lines that name the failure (at most 3), else the last line."""
    lines = [t.strip() for t in log_tail if t.strip()]
    named = [t for t in lines if CAUSE.search(t)]
    return [t[:200] for t in (named[-3:] or lines[-1:])]


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
        lines += ["", model_title(res, name), ""] + table(res, name)
    lines += [""] + scaling(res) + allreduce_table(res) + targets(res, ranks)
    errs = errors(res)
    return "\n".join(lines + ([""] + errs if errs else [])) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("--append", metavar="FILE", help="append the section to FILE instead of printing it")
    p.add_argument("--ranks", type=int, help="GPU count the targets are judged at (default: the run's largest, else 2)")
    args = p.parse_args()
    with open(args.results) as f:
        res = Results(f.readlines())
    text = section(res, args.ranks or max(res.rank_counts() or [2]))
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
