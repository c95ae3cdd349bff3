"""Turns bench.sh's results.jsonl into a markdown section for bench/RESULTS.md.

  python3 bench/report.py RESULTS.jsonl [--append bench/RESULTS.md] [--ranks 2]

Prints (or appends) a heading with the date and machine, one table per model (rows:
GPU count x system; columns: median, min, max ms per step, peak memory, speed-up
over DDP eager at the same GPU count), the scaling efficiency of each system
(1-GPU step / N-GPU step) and all_reduce's bus bandwidth (bench/allreduce.py) where
the run has several GPU counts, the issue's targets marked met or MISSED with
their numbers (at --ranks GPUs), and every error the run recorded.
Needs no torch: it only reads the JSON lines that bench.sh, record.py,
models.py and torch_step.py wrote.
"""
import argparse
import datetime
import json
import re

SYSTEMS = [("spmd", "spmd-run"), ("ddp", "DDP eager"), ("compile", "torch.compile(DDP)")]
LABEL = dict(SYSTEMS)
MIB = 1024.0 * 1024.0
# Log lines that say why a command failed (the last line is often only a hint).
CAUSE = re.compile(r"\berror:|Error\b|No such file|not found|Killed|[Tt]imed? ?out|Aborted|Segmentation")


class Results:
    """The lines of one results.jsonl, by kind."""

    def __init__(self, lines):
        self.machine, self.models, self.runs, self.pipelines, self.errors = {}, {}, {}, {}, []
        self.allreduces = []
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
            self.runs[(row["model"], row["system"], row["ranks"])] = row
        elif kind == "pipeline":
            self.pipelines[row["model"]] = row
        elif kind == "allreduce":
            self.allreduces.append(row)
        elif kind == "error":
            self.errors.append(row)

    def run(self, model, system, ranks):
        return self.runs.get((model, system, ranks))

    def model_names(self):
        names = list(self.models)
        return names + sorted({m for m, _, _ in self.runs} - set(names))

    def rank_counts(self, model):
        return sorted({r for m, _, r in self.runs if m == model})

    def failure(self, model, system, ranks):
        for e in self.errors:
            if e.get("model") == model and e.get("system") == system and e.get("ranks") in (ranks, None):
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
    lines = ["## %s — issue #6 benchmark: spmd-run beside DDP eager and torch.compile(DDP)" % date.split(" ")[0], ""]
    if m.get("gpus"):
        what = "%d x %s (driver %s), CUDA %s, NCCL %s" % (
            m["gpus"], m.get("gpu"), m.get("driver"), m.get("cuda"), m.get("nccl"))
    else:
        what = "CPU only (%s cores)" % m.get("host_cpus", "?")
    env = ", ".join("`%s=%s`" % kv for kv in sorted(m.get("env", {}).items()))
    lines.append("Machine: %s, torch %s%s; spmd at %s, run %s. Every system: fp32 parameters, TF32 matmuls on, Adam."
                 % (what, m.get("torch", "?"), ", " + env if env else "", m.get("commit") or "?", date))
    lines += [""] + ["- %s" % n for n in m.get("notes", [])]
    return lines


def model_title(res, name):
    meta = res.models.get(name, {})
    any_run = next((r for (m, _, _), r in sorted(res.runs.items()) if m == name), {})
    parts = [meta.get("about", name)]
    if meta.get("params"):
        n = meta["params"]
        parts.append("%.1fM parameters" % (n / 1e6) if n >= 1e6 else "{:,} parameters".format(n))
    if meta.get("inputs"):
        parts.append("per rank " + ", ".join("`%s`" % i for i in meta["inputs"]))
    if meta.get("lr"):
        parts.append("Adam lr %g" % meta["lr"])
    if any_run:
        parts.append("%s timed steps after %s warm-up" % (any_run.get("steps"), any_run.get("warmup")))
    return "### %s — %s" % (name, "; ".join(parts))


def compile_warmups(res, name, rank_counts):
    """torch.compile's first steps (which compile), e.g. '26.9 s at 1 GPU, 24.3 s at 2 GPUs'."""
    rows = [res.run(name, "compile", r) for r in rank_counts]
    done = [w for w in rows if w and w.get("compile_s")]
    return ", ".join("%.1f s at %s" % (w["compile_s"], gpus(w["ranks"])) for w in done) or "—"


def table(res, name):
    lines = ["| GPUs | system | median ms | min ms | max ms | peak MiB | vs DDP eager |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    warm_included = False
    for ranks in res.rank_counts(name) or [1, 2]:
        ddp = res.run(name, "ddp", ranks)
        for system, label in SYSTEMS:
            row = res.run(name, system, ranks)
            if row is None:
                status = "failed" if res.failure(name, system, ranks) else "not run"
                lines.append("| %d | %s | %s | — | — | — | — |" % (ranks, label, status))
                continue
            if row.get("warmup_excluded") is False:
                label, warm_included = label + " *", True
            speedup = ratio(ddp and ddp["median_ms"], row["median_ms"])
            lines.append("| %d | %s | %s | %s | %s | %s | %s |" % (
                ranks, label, ms(row["median_ms"]), ms(row["min_ms"]), ms(row["max_ms"]), mib(row.get("peak_bytes")),
                times(speedup)))
    if warm_included:
        lines += ["", "\\* spmd-run's timings include the warm-up steps (this spmd-run has no `--warmup`)."]
    warmups = compile_warmups(res, name, res.rank_counts(name))
    pipe = res.pipelines.get(name)
    notes = []
    if pipe:
        notes.append("spmd pipeline (spmd-expand to spmd-lower, wall) %.2f s" % pipe["median_s"]
                     + (" (median of %d)" % len(pipe["runs_s"]) if len(pipe["runs_s"]) > 1 else ""))
    if warmups != "—":
        notes.append("torch.compile warm-up (first step, cold cache): " + warmups)
    return lines + ([""] + ["Compile time: " + "; ".join(notes) + "."] if notes else [])


class Target:
    """One line of the Targets list: met or MISSED, with its numbers."""

    def __init__(self, text):
        self.text = text

    def line(self, met, numbers):
        if met is None:
            return "- **MISSED** (not measured) — %s: %s" % (self.text, numbers)
        return "- %s — %s: %s" % ("met" if met else "**MISSED**", self.text, numbers)


def median_ms(res, model, system, ranks):
    row = res.run(model, system, ranks)
    return row["median_ms"] if row else None


def speed_target(res, model, ranks, least, text, aim=None):
    spmd, ddp = median_ms(res, model, "spmd", ranks), median_ms(res, model, "ddp", ranks)
    r = ratio(ddp, spmd)
    numbers = "DDP eager %s ms / spmd-run %s ms = %s (need >= %gx%s)" % (
        ms(ddp), ms(spmd), times(r), least, ", aim %gx" % aim if aim else "")
    return Target(text).line(None if r is None else r >= least, numbers)


def scaling_target(res, model, ranks):
    one, many = median_ms(res, model, "spmd", 1), median_ms(res, model, "spmd", ranks)
    r = ratio(many, one)
    numbers = "spmd-run %s ms at 1 GPU, %s ms at %d GPUs = %s (need <= 1.03x)" % (ms(one), ms(many), ranks, times(r))
    return Target("%s: spmd-run at %d GPUs within 3%% of 1 GPU" % (model, ranks)).line(
        None if r is None else r <= 1.03, numbers)


def compile_target(res, model, ranks, limit=2.0):
    pipe = res.pipelines.get(model)
    warm = compile_warmups(res, model, sorted({1, ranks}))
    got = pipe["median_s"] if pipe else None
    numbers = "spmd pipeline %s s (need < %g s); torch.compile warm-up %s" % (
        "—" if got is None else "%.2f" % got, limit, warm)
    return Target("%s compile pipeline under %g s" % (model, limit)).line(None if got is None else got < limit, numbers)


def memory_target(res, model, ranks):
    spmd, ddp = res.run(model, "spmd", ranks), res.run(model, "ddp", ranks)
    a, b = spmd and spmd.get("peak_bytes"), ddp and ddp.get("peak_bytes")
    numbers = "spmd-run %s MiB, DDP eager %s MiB" % (mib(a), mib(b))
    return Target("%s peak memory at %d GPUs no more than DDP eager's" % (model, ranks)).line(
        None if not a or not b else a <= b, numbers)


def targets(res, ranks):
    at = "at %s" % gpus(ranks)
    lines = ["### Targets", "",
             speed_target(res, "mlp", ranks, 5, "seeds' MLP %s: spmd-run at least 5x faster than DDP eager" % at, 10),
             speed_target(res, "mlp4096", ranks, 0.97, "mlp4096 %s: spmd-run no slower than 0.97x DDP eager" % at),
             scaling_target(res, "mlp4096", ranks),
             speed_target(res, "gpt", ranks, 1.0, "gpt %s: spmd-run no slower than DDP eager" % at),
             compile_target(res, "gpt", ranks)]
    lines += [memory_target(res, m, ranks) for m in ("mlp", "mlp4096", "gpt")]
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
                                           e.get("ranks") and gpus(e["ranks"])) if x)
        why = " / ".join("`%s`" % t.replace("`", "'") for t in cause(e.get("log_tail", [])))
        lines.append("- %s: %s%s" % (where, e.get("what"), " — " + why if why else ""))
    return lines


def scaling(res):
    """Per model and system: 1-GPU step / N-GPU step (1.0 is perfect weak scaling)."""
    counts = sorted({r for _, _, r in res.runs if r > 1})
    if not counts:
        return []
    lines = ["### Scaling efficiency (1-GPU step / N-GPU step, batch per GPU fixed)", "",
             "| model | system | " + " | ".join(gpus(n) for n in counts) + " |",
             "| --- | --- |" + " ---: |" * len(counts)]
    for name in res.model_names():
        for system, label in SYSTEMS:
            one = median_ms(res, name, system, 1)
            cells = [ratio(one, median_ms(res, name, system, n)) for n in counts]
            if all(c is None for c in cells):
                continue
            lines.append("| %s | %s | %s |" % (name, label, " | ".join("—" if c is None else "%.3f" % c for c in cells)))
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
    p.add_argument("--ranks", type=int, default=2, help="GPU count the targets are judged at")
    args = p.parse_args()
    with open(args.results) as f:
        text = section(Results(f.readlines()), args.ranks)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
