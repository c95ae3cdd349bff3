#!/usr/bin/env python3
"""The layering rules of ARCHITECTURE.md, checked on the sources.

Each libspmd directory is a layer; a file may include spmd headers only from
its own layer and the layers listed for it below, so that dependencies run
one way. Inside a layer, modules (a header and the sources of the same stem)
include each other without a cycle. Also: no libspmd source over 600 lines.
Prints one line per violation and exits 1 if there is any.
"""
import collections
import pathlib
import re
import sys

# layer -> the layers it may include (besides itself)
ALLOWED = {
    "support": set(),
    "ops": {"support"},
    "ir": {"support", "ops"},
    "analysis": {"support", "ops", "ir"},
    "passes": {"support", "ops", "ir", "analysis"},
    "io": {"support", "ops", "ir"},
    "backend": {"support", "ops", "ir"},
    "runtime": {"support", "ops", "ir", "analysis", "io", "backend"},
    "pipelines": {"support", "ops", "ir", "analysis", "passes", "io", "backend"},
    "driver": {"support", "ops", "ir", "analysis", "passes", "io", "backend", "runtime", "pipelines"},
}
MAX_LINES = 600
INCLUDE = re.compile(r'^\s*#\s*include\s+"spmd/([a-z_]+)/')
# Any project header: "spmd/<layer>/<stem>.h", or "<stem>.h" beside the source.
MODULE_INCLUDE = re.compile(r'^\s*#\s*include\s+"(?:spmd/([a-z_]+)/)?([a-z_0-9]+)\.h"')


def layer_of(path, root):
    parts = path.relative_to(root).parts
    # libspmd/include/spmd/<layer>/... or libspmd/src/<layer>/...
    return parts[3] if parts[1] == "include" else parts[2]


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = []
    files = sorted(p for p in (root / "libspmd").rglob("*") if p.suffix in (".h", ".cpp"))
    if not files:
        problems.append(f"{root}/libspmd: no sources found")
    edges = collections.defaultdict(set)  # (layer, stem) -> modules of the same layer it includes
    for path in files:
        layer = layer_of(path, root)
        rel = path.relative_to(root)
        if layer not in ALLOWED:
            problems.append(f"{rel}: directory '{layer}' is no known layer")
            continue
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines (at most {MAX_LINES})")
        for number, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if m and m.group(1) != layer and m.group(1) not in ALLOWED[layer]:
                problems.append(f"{rel}:{number}: {layer} includes spmd/{m.group(1)}/ (a layer above it)")
            m = MODULE_INCLUDE.match(line)
            if m and (m.group(1) or layer) == layer and m.group(2) != path.stem:
                edges[(layer, path.stem)].add((layer, m.group(2)))
    for component in cycles(edges):
        problems.append(f"libspmd/*/{component[0][0]}: an include cycle among " +
                        ", ".join(stem for _, stem in component))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
