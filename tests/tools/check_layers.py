#!/usr/bin/env python3
"""The layering rules of ARCHITECTURE.md, checked on the sources.

Each libspmd directory is a layer; a file may include spmd headers only from
its own layer and the layers listed for it below, so that dependencies run
one way. Also: no libspmd source over 600 lines. Prints one line per
violation and exits 1 if there is any.
"""
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
    "runtime": {"support", "ops", "ir", "analysis", "io"},
    "pipelines": {"support", "ops", "ir", "analysis", "passes", "io"},
}
MAX_LINES = 600
INCLUDE = re.compile(r'^\s*#\s*include\s+"spmd/([a-z_]+)/')


def layer_of(path, root):
    parts = path.relative_to(root).parts
    # libspmd/include/spmd/<layer>/... or libspmd/src/<layer>/...
    return parts[3] if parts[1] == "include" else parts[2]


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = []
    files = sorted(p for p in (root / "libspmd").rglob("*") if p.suffix in (".h", ".cpp"))
    if not files:
        problems.append(f"{root}/libspmd: no sources found")
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
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
