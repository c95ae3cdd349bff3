"""torch.export programs (.pt2) as spmd's input: what is read, and what is refused.

  check_pt2.py BIN_DIR [--python PY]

Writes programs with the python's torch (CI's: 2.6, the flat layout) into a
temporary folder, with tests/pt2/make_fixtures.py and small models of its own,
and checks with BIN/spmd-inspect, spmd-expand and spmd-split that:

* both layouts are read (the flat files written here, the PT2 archives in
  tests/pt2/fixtures), with the module's parameter and buffer names and the
  user's source lines;
* --input restates the program's shapes and must agree; a symbolic size
  needs --input;
* spmd-split buckets a .pt2 as it buckets the TorchScript module of the same
  model (DDPOptimizer's buckets for the module's own ops);
* each refusal is one line `TOOL: error: FILE: WHERE: WHAT` with exit code 1
  and no output file: a higher-order op, a first output that is no floating
  scalar, a joint program's input mutation, a newer schema major version, a
  cut file;
* a `torch.no_grad()` block (the higher-order op wrap_with_set_grad_enabled,
  tests/pt2/fixtures/no_grad.pt2 from make_program_fixtures.py) trains as
  eager PyTorch trains it, and so do a mask made under torch.vmap
  (vmap.pt2, likewise) and a mixture of experts through transformers'
  grouped GEMM op (experts.pt2); ATen's _grouped_mm (experts_aten.pt2 and
  its TorchScript trace experts_aten.pt, which LibTorch before 2.8 could not
  load) is read;
* `python3 -m spmd_export --format pt2` writes a .pt2 spmd reads, and refuses
  a model that does not return the loss.

Prints PASS/FAIL per check and exits 1 if any failed.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "fixtures")

MODELS = r'''
import torch, torch.nn as nn, torch.nn.functional as F

class Cond(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(4, 4)
    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (self.l(x),))
        return y.sum()

class NotALoss(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(4, 3)
    def forward(self, x):
        return self.l(x)

class WritesInput(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(4, 4)
    def forward(self, x):
        x.add_(1)
        return self.l(x).sum()

class Loss(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(4, 3)
    def forward(self, x, y):
        return F.cross_entropy(self.l(x), y)

def step():
    model = Loss()
    return None, model, None, (torch.randn(8, 4), torch.randint(0, 3, (8,)))

def not_a_loss():
    return None, NotALoss(), None, (torch.randn(8, 4),)

if __name__ == "__main__":
    import sys
    out = sys.argv[1]
    x = torch.randn(8, 4)
    torch.export.save(torch.export.export(Cond(), (x,)), out + "/cond.pt2")
    torch.export.save(torch.export.export(NotALoss(), (x,)), out + "/not_a_loss.pt2")
    torch.export.save(torch.export.export(WritesInput(), (x.clone(),)).run_decompositions(), out + "/writes_input.pt2")
'''

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok or not detail else ": " + detail), flush=True)


def run(argv, **kw):
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)


def refused(name, argv, file, where_what, out=None):
    """argv fails with one error line naming `file` and matching where_what; `out` is not left."""
    proc = run(argv)
    lines = proc.stderr.strip().splitlines()
    tool = os.path.basename(argv[0])
    pattern = re.escape(f"{tool}: error: {file}: ") + where_what
    ok = proc.returncode == 1 and len(lines) == 1 and re.match(pattern, lines[0]) and not proc.stdout
    ok = ok and (out is None or not os.path.exists(out))
    check(name, bool(ok), f"exit {proc.returncode}, stderr {proc.stderr.strip()[:400]!r}")


def trains_like_eager(tool, python, tmp, name):
    """FIXTURES/NAME.pt2 through expand | lower | run for 2 SGD steps (lr 0.1)
    on NAME.data.pt: its parameters against NAME.expected.pt, eager's."""
    step, ours = os.path.join(tmp, name + ".spmd"), os.path.join(tmp, name + ".ours.pt")
    graph = run([tool["spmd-expand"], os.path.join(FIXTURES, name + ".pt2"), "--optimizer", "sgd", "--lr", "0.1"])
    lowered = run([tool["spmd-lower"], "-o", step], input=graph.stdout)
    ran = run([tool["spmd-run"], step, "--steps", "2", "--data", os.path.join(FIXTURES, name + ".data.pt"),
               "--save-params", ours, "--device", "cpu"])
    if graph.returncode or lowered.returncode or ran.returncode:
        print("    " + (graph.stderr + lowered.stderr + ran.stderr).strip()[-400:])
        return False
    compare = run([python, "-c", "import sys, torch; a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2]); "
                   "sys.exit(0 if a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) "
                   "for k in b) else 1)", ours, os.path.join(FIXTURES, name + ".expected.pt")])
    return compare.returncode == 0


def program_names(path):
    """Parameter and buffer names of a .pt2 as its signature gives them, read with Python's zipfile."""
    with zipfile.ZipFile(path) as z:
        member = next(n for n in z.namelist() if n.endswith("serialized_exported_program.json") or "/models/" in n)
        text = z.read(member).decode().replace("-Infinity", "0").replace("Infinity", "0").replace("NaN", "0")
    names = []
    for spec in json.loads(text)["graph_module"]["signature"]["input_specs"]:
        for kind, field in (("parameter", "parameter_name"), ("buffer", "buffer_name")):
            if kind in spec and spec[kind][field] not in names:  # a tied weight is one input
                names.append(spec[kind][field])
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bin_dir")
    p.add_argument("--python", default="/usr/bin/python3")
    a = p.parse_args()
    tool = {t: os.path.join(os.path.abspath(a.bin_dir), t)
            for t in ("spmd-inspect", "spmd-expand", "spmd-split", "spmd-lower", "spmd-run")}
    tmp = tempfile.mkdtemp(prefix="spmd-pt2-")
    try:
        gen = run([a.python, os.path.join(HERE, "make_fixtures.py"), tmp])
        check("make_fixtures.py with this torch", gen.returncode == 0, gen.stderr[-800:])
        with open(os.path.join(tmp, "models_pt2.py"), "w") as f:
            f.write(MODELS)
        gen = run([a.python, os.path.join(tmp, "models_pt2.py"), tmp])
        check("export the refused programs", gen.returncode == 0, gen.stderr[-800:])

        # Both layouts, with the module's names and the user's source lines.
        for folder, layout in ((tmp, "flat"), (FIXTURES, "pt2 archive")):
            for name in ("mlp", "lm", "cnn", "mlp.core", "lm.core", "cnn.core"):
                path = os.path.join(folder, name + ".pt2")
                proc = run([tool["spmd-inspect"], path])
                listing = proc.stdout
                inputs = re.findall(r"^  input %(\S+): \S+ (parameter|buffer)", listing, re.M)
                # The LM ties its head to its embedding: one parameter, under
                # its first name (torch 2.6 calls both uses head.weight).
                expected = ["tok.weight" if n == "head.weight" else n for n in program_names(path)]
                expected = [n for i, n in enumerate(expected) if n not in expected[:i]]
                ok = proc.returncode == 0 and [n for n, _ in inputs] == expected
                ok = ok and re.search(r"# models\.py:\d+$", listing, re.M) is not None
                check(f"{layout} {name}.pt2: names and source lines", ok, proc.stderr.strip()[:400] or listing[:400])
        lm_inputs = ["--input", "tokens:i64[4,16]", "--input", "targets:i64[4,16]"]
        fixture = os.path.join(FIXTURES, "lm.pt2")
        same = run([tool["spmd-inspect"], fixture]).stdout == run([tool["spmd-inspect"], fixture, *lm_inputs]).stdout
        check("--input restating the program's shapes changes nothing", same)
        refused("--input that disagrees", [tool["spmd-inspect"], fixture, "--input", "tokens:i64[4,8]"],
                fixture, re.escape("--input tokens: dimension 1 of the program's input 'tokens' is 16, not 8"))
        refused("--input for no input", [tool["spmd-inspect"], fixture, "--input", "x:f32[4]"],
                fixture, re.escape("--input x: the program has no input 'x'"))
        dynamic = os.path.join(FIXTURES, "lm.dynamic.pt2")
        refused("a symbolic size without --input", [tool["spmd-inspect"], dynamic], dynamic,
                re.escape("input 'tokens': dimension 0 is symbolic"))
        proc = run([tool["spmd-inspect"], dynamic, "--input", "tokens:i64[6,16]", "--input", "targets:i64[6,16]"])
        check("a symbolic size --input fixes", proc.returncode == 0 and "%tokens: i64[6,16] data" in proc.stdout,
              proc.stderr.strip()[:400])

        # The same buckets as the TorchScript module's (a small cap, to have several).
        split = ["--bucket-cap-mb", "0.01", "--first-bucket-cap-mb", "0.01"]
        tables = {}
        for source, extra in ((os.path.join(ROOT, "samples", "lm.pt"), lm_inputs), (fixture, []),
                              (os.path.join(tmp, "lm.pt2"), [])):
            graph = run([tool["spmd-expand"], source, *extra, "--optimizer", "sgd", "--lr", "0.1"])
            bucketed = run([tool["spmd-split"], *split], input=graph.stdout)
            table = run([tool["spmd-inspect"], "-", "--buckets"], input=bucketed.stdout)
            tables[source] = table.stdout if table.returncode == 0 else "failed: " + graph.stderr + bucketed.stderr
        # The LM ties its head to its embedding: named_parameters() calls the
        # one parameter tok.weight (its first name), torch.export head.weight.
        values = [t.replace("head.weight", "tok.weight") for t in tables.values()]
        check("buckets of lm.pt2 (both layouts) equal lm.pt's", values[0] == values[1] == values[2] and
              values[0].count("\n") > 2, "\n".join(values))

        # A torch.no_grad() block (wrap_with_set_grad_enabled, torch 2.14's
        # export): trained as eager PyTorch trains it, no gradient through it.
        check("a no_grad block trains as in eager", trains_like_eager(tool, a.python, tmp, "no_grad"))
        # A torch.vmap (transformers' mask functions; torch 2.14's export
        # keeps it as torch._functorch.predispatch calls): trained as eager.
        check("a vmap-made mask trains as in eager", trains_like_eager(tool, a.python, tmp, "vmap"))
        # Mixtures of experts (transformers' grouped_mm experts): its
        # custom op trains as in eager; ATen's _grouped_mm, which this
        # LibTorch may lack, is read as the same spmd op.
        check("experts through transformers' grouped_mm_fallback train as in eager",
              trains_like_eager(tool, a.python, tmp, "experts"))
        aten_experts = run([tool["spmd-expand"], os.path.join(FIXTURES, "experts_aten.pt2"), "--optimizer", "sgd",
                            "--lr", "0.1"])
        check("ATen's _grouped_mm is read as spmd::grouped_mm", aten_experts.returncode == 0 and
              aten_experts.stdout.count("spmd::grouped_mm") >= 2, aten_experts.stderr)
        traced_experts = run([tool["spmd-expand"], os.path.join(FIXTURES, "experts_aten.pt"), "--input",
                              "x:f32[4,8]", "--input", "y:f32[4,8]", "--optimizer", "sgd", "--lr", "0.1"])
        check("a TorchScript trace calling aten::_grouped_mm is read", traced_experts.returncode == 0 and
              "_grouped_mm" in traced_experts.stdout, traced_experts.stderr)

        # Refusals, one line each, with no output left.
        out = os.path.join(tmp, "out.json")
        cond = os.path.join(tmp, "cond.pt2")
        refused("a higher-order op", [tool["spmd-inspect"], cond, "-o", out], cond,
                r".*higher-order op 'cond'", out)
        not_loss = os.path.join(tmp, "not_a_loss.pt2")
        refused("a first output that is no scalar", [tool["spmd-expand"], not_loss, "--optimizer", "sgd", "--lr", "1",
                                                     "-o", out], not_loss,
                re.escape("output 0: the first output is Float of 2 dimensions"), out)
        writes = os.path.join(tmp, "writes_input.pt2")
        refused("a program that writes its input", [tool["spmd-inspect"], writes], writes,
                re.escape("graph_signature: the program writes its input 'x' in place"))
        newer = os.path.join(tmp, "newer.pt2")
        with zipfile.ZipFile(os.path.join(tmp, "mlp.pt2")) as src, zipfile.ZipFile(newer, "w") as dst:
            for item in src.infolist():
                data = src.read(item)
                if item.filename == "serialized_exported_program.json":
                    doc = json.loads(data)
                    doc["schema_version"]["major"] = 9
                    data = json.dumps(doc).encode()
                dst.writestr(item, data)
        refused("a newer schema major version", [tool["spmd-inspect"], newer], newer,
                re.escape("serialized_exported_program.json: schema_version: schema version 9."))
        cut = os.path.join(tmp, "cut.pt2")
        with open(os.path.join(FIXTURES, "cnn.pt2"), "rb") as f:
            data = f.read()
        with open(cut, "wb") as f:
            f.write(data[: len(data) // 2])
        refused("a cut file", [tool["spmd-inspect"], cut], cut, ".+")

        # spmd_export --format pt2.
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        written = os.path.join(tmp, "exported.pt2")
        proc = run([a.python, "-m", "spmd_export", os.path.join(tmp, "models_pt2.py") + ":step", "--format", "pt2",
                    "-o", written], env=env)
        listing = run([tool["spmd-inspect"], written]).stdout if proc.returncode == 0 else ""
        check("spmd_export --format pt2 writes a program spmd reads",
              "input %l.weight: f32[3,4] parameter" in listing and "aten::linear" in listing, proc.stderr[-400:])
        bad = os.path.join(tmp, "bad.pt2")
        proc = run([a.python, "-m", "spmd_export", os.path.join(tmp, "models_pt2.py") + ":not_a_loss", "--format",
                    "pt2", "-o", bad], env=env)
        check("spmd_export --format pt2 refuses a model that returns no loss",
              proc.returncode == 1 and proc.stderr.count("\n") == 1 and "must return the loss" in proc.stderr
              and not os.path.exists(bad), proc.stderr[-400:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
