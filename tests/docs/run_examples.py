#!/usr/bin/env python3
"""Run the shell examples of README.md and docs/**/*.md, and check their links.

  run_examples.py SOURCE_DIR BUILD_DIR [--only FILE]... [--python PY]
                  [--timeout SEC] [--keep-going] [--links-only] [-v]

Every fenced code block whose info string is exactly `sh` runs; blocks marked
`text`, `console` or anything else are shown, never run. The pages are README.md
and every docs/**/*.md (hidden files and folders left out), in sorted order;
`--only FILE` (repeatable) takes just those pages, which may lie anywhere.

A page's blocks run in order, each as `bash -euo pipefail -c BLOCK`, in one fresh
scratch folder per page, BUILD_DIR/docs-examples/<page>/, in which `build` links to
BUILD_DIR and `samples`, `python`, `tests`, `bench`, `schemas` link to the
project's folders: so a block says `build/spmd-inspect samples/mlp.pt ...` as a
user in the project's root would, and the files it writes stay in the scratch
folder. A later block sees what an earlier one wrote. stdin is /dev/null. With
`--python PY`, `python3` in a block is PY (the python3 that imports torch).

A block that exits non-zero, or runs longer than --timeout seconds (default 60;
its whole process group is then killed), fails as FILE:LINE (the line of its
opening fence) with the tail of its output; the page's later blocks are skipped,
other pages still run.

A flag a page quotes for one of spmd's tools must be one that tool's `--help`
lists: in code blocks (of any kind) and code spans, the `--flags` that follow
`spmd-TOOL` on its command line (up to a `|`, `;` or `&&`; a backslash continues the
line), and on docs/tools/spmd-TOOL.md the flags in the first cell of each table
row; and that page must name every flag the tool's `--help` lists (as `--flag`,
or as a config key in backticks).

Each page must also keep to the project: a link (`[text](target)`, an image, a
reference definition) to a relative path must name a file or folder that exists
inside SOURCE_DIR; absolute paths and `../shared` anywhere in the text are
refused. Finding no `sh` block at all is a failure too: a test that runs nothing
checks nothing.

`--links-only` checks links and counts blocks without running any.

Exit status: 0 when every block ran and every page is clean, 1 otherwise, 2 for
bad arguments.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

PROJECT_LINKS = ("samples", "python", "tests", "bench", "schemas")
TAIL_LINES = 30

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# [text](target "title") and ![alt](target); the target has no spaces or
# is in <...>.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class Block:
    def __init__(self, line, info, text):
        self.line = line      # 1-based line of the opening fence
        self.info = info
        self.text = text


def parse(text):
    """The page's fenced code blocks, and its lines outside them (for links)."""
    blocks, prose = [], []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m.group("fence")[0] == "`" and "`" in m.group("info")):
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        indent, fence = len(m.group("indent")), m.group("fence")
        start, body = i + 1, []
        i += 1
        closed = False
        while i < len(lines):
            c = FENCE.match(lines[i])
            if (c and c.group("fence")[0] == fence[0] and len(c.group("fence")) >= len(fence)
                    and not c.group("info").strip()):
                closed = True
                i += 1
                break
            line = lines[i]
            # A block inside a list item is indented with its fence.
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            i += 1
        if not closed:
            raise ValueError(f"line {start}: code block never closed")
        blocks.append(Block(start, m.group("info").strip(), "\n".join(body) + "\n"))
    return blocks, prose


TOOL_WORD = re.compile(r"(?:^|[\s/`(])(spmd-(?:expand|split|unroll|lower|compile|train|run|inspect|opt))(?![\w.-])")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
COMMAND_BREAK = re.compile(r"\||;|&&")
HELP_OPTION = re.compile(r"^\s+(?:-\w,)?(--[a-z][a-z0-9-]*)", re.M)


def tool_flags(build_dir, tool, cache):
    """The flags `tool --help` lists (None when the tool is not built)."""
    if tool not in cache:
        exe = os.path.join(build_dir, tool)
        help_text = subprocess.run([exe, "--help"], capture_output=True, text=True,
                                   timeout=60).stdout if os.path.exists(exe) else None
        # The options column only: a description may mention another tool's flag.
        cache[tool] = set(HELP_OPTION.findall(help_text)) if help_text else None
    return cache[tool]


def quoted_flags(text):
    """(tool, flag) for each --flag following `spmd-TOOL` on a command line of `text`."""
    found = []
    for command in COMMAND_BREAK.split(text.replace("\\\n", " ")):
        for line in command.split("\n"):
            tools = list(TOOL_WORD.finditer(line))
            for k, m in enumerate(tools):
                end = tools[k + 1].start() if k + 1 < len(tools) else len(line)
                found += [(m.group(1), flag) for flag in FLAG.findall(line[m.end():end])]
    return found


def flag_problems(path, text, blocks, prose, build_dir, cache):
    """Flags a page quotes that the tool's --help does not list."""
    quoted = []
    for block in blocks:
        quoted += [(block.line, tool, flag) for tool, flag in quoted_flags(block.text)]
    for lineno, line in prose:
        for span in CODE_SPAN.finditer(line):
            quoted += [(lineno, tool, flag) for tool, flag in quoted_flags(span.group(0).strip("`"))]
    page_tool = os.path.basename(path)[:-3]
    if TOOL_WORD.fullmatch(" " + page_tool):
        for lineno, line in prose:
            cells = line.split("|")
            if line.lstrip().startswith("|") and len(cells) > 2:
                quoted += [(lineno, page_tool, flag) for flag in FLAG.findall(cells[1])]
    problems = []
    if TOOL_WORD.fullmatch(" " + page_tool) and tool_flags(build_dir, page_tool, cache) is not None:
        # spmd-train's page may name a flag as its config key: `lr`.
        named = set(FLAG.findall(text)) | {"--" + key for key in re.findall(r"`([a-z][a-z0-9-]*)`", text)}
        for flag in sorted(tool_flags(build_dir, page_tool, cache) - named):
            problems.append(f"1: does not name {flag}, which `{page_tool} --help` lists")
    for lineno, tool, flag in quoted:
        flags = tool_flags(build_dir, tool, cache)
        if flags is not None and flag not in flags:
            problems.append(f"{lineno}: quotes {tool} {flag}, which `{tool} --help` does not list")
    return problems


def link_problems(page, prose, source_dir):
    """Links that leave the project or name nothing in it."""
    problems = []
    root = os.path.realpath(source_dir)
    base = os.path.dirname(os.path.realpath(page))
    for lineno, line in prose:
        plain = CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(plain)]
        d = REFERENCE_DEF.match(plain)
        if d:
            targets.append(d.group(1))
        for target in targets:
            target = target.strip("<>")
            if SCHEME.match(target) or target.startswith("#"):
                continue   # a web address or an anchor on this page
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not path:
                continue
            if path.startswith("/"):
                problems.append(f"{lineno}: link to an absolute path {target!r}: it is not in the project")
                continue
            full = os.path.realpath(os.path.join(base, path))
            if full != root and not full.startswith(root + os.sep):
                problems.append(f"{lineno}: link {target!r} leads outside the project")
            elif not os.path.exists(full):
                problems.append(f"{lineno}: link {target!r}: no such file or folder in the project")
    return problems


def tail(output):
    lines = output.decode(errors="replace").rstrip("\n").split("\n")
    cut = lines[-TAIL_LINES:]
    head = [f"    ... ({len(lines) - len(cut)} lines before)"] if len(lines) > len(cut) else []
    return "\n".join(head + ["    | " + l for l in cut])


def scratch_for(name, build_dir, source_dir, python):
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    scratch = os.path.join(build_dir, "docs-examples", slug)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    os.symlink(build_dir, os.path.join(scratch, "build"))
    for folder in PROJECT_LINKS:
        os.symlink(os.path.join(source_dir, folder), os.path.join(scratch, folder))
    env = dict(os.environ)
    if python:
        # A script, not a link: a virtual environment's python finds its
        # packages from the path it is started by.
        bindir = os.path.join(scratch, ".bin")
        os.makedirs(bindir)
        shim = os.path.join(bindir, "python3")
        with open(shim, "w") as f:
            f.write(f'#!/bin/sh\nexec "{python}" "$@"\n')
        os.chmod(shim, 0o755)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return scratch, env


def run_block(block, cwd, env, timeout):
    """(ok, why, output) of one block."""
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block.text], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return False, f"still running after {timeout:g} s, stopped", out
    if proc.returncode != 0:
        return False, f"exit status {proc.returncode}", out
    return True, "", out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.split("\n")[1:]))
    parser.add_argument("source_dir")
    parser.add_argument("build_dir")
    parser.add_argument("--only", action="append", metavar="FILE",
                        help="check only this page (repeatable; relative to SOURCE_DIR or the working folder)")
    parser.add_argument("--python", help="python3 that `python3` in a block runs")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per block (60)")
    parser.add_argument("--keep-going", action="store_true",
                        help="run a page's later blocks after one failed")
    parser.add_argument("--links-only", action="store_true",
                        help="check links and count the sh blocks, run nothing")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per block")
    args = parser.parse_args()

    source_dir = os.path.realpath(args.source_dir)
    build_dir = os.path.realpath(args.build_dir)
    if not os.path.isfile(os.path.join(source_dir, "README.md")):
        parser.error(f"{args.source_dir}: no README.md, not the project's root")
    if not os.path.isdir(build_dir):
        parser.error(f"{args.build_dir}: no such build folder")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")

    pages = []   # (shown name, path)
    if args.only:
        for name in args.only:
            path = name if os.path.isabs(name) else (
                os.path.join(source_dir, name) if os.path.exists(os.path.join(source_dir, name)) else name)
            if not os.path.isfile(path):
                parser.error(f"--only {name}: no such file")
            path = os.path.realpath(path)
            shown = os.path.relpath(path, source_dir) if path.startswith(source_dir + os.sep) else name
            pages.append((shown, path))
    else:
        pages.append(("README.md", os.path.join(source_dir, "README.md")))
        found = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(source_dir, "docs")):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for f in filenames:
                if f.endswith(".md") and not f.startswith("."):
                    full = os.path.join(dirpath, f)
                    found.append((os.path.relpath(full, source_dir), full))
        pages += sorted(found)

    failures, ran, shown_blocks, helps = [], 0, 0, {}
    for name, path in pages:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            blocks, prose = parse(text)
        except ValueError as e:
            failures.append(f"{name}:{e}")
            continue
        for lineno, line in enumerate(text.split("\n"), 1):
            if "../shared" in line:
                failures.append(f"{name}:{lineno}: mentions '../shared', a folder outside the project")
        failures += [f"{name}:{p}" for p in link_problems(path, prose, source_dir)]
        failures += [f"{name}:{p}" for p in flag_problems(path, text, blocks, prose, build_dir, helps)]

        runnable = [b for b in blocks if b.info == "sh"]
        shown_blocks += len(blocks) - len(runnable)
        if not runnable:
            print(f"{name}: no sh blocks")
            continue
        if args.links_only:
            ran += len(runnable)
            print(f"{name}: {len(runnable)} sh blocks (not run)")
            continue
        scratch, env = scratch_for(name, build_dir, source_dir, args.python)
        page_ok, started = 0, time.monotonic()
        for i, block in enumerate(runnable):
            t0 = time.monotonic()
            ok, why, out = run_block(block, scratch, env, args.timeout)
            ran += 1
            if args.verbose:
                print(f"{name}:{block.line}: {'ok' if ok else 'FAILED'} ({time.monotonic() - t0:.1f} s)")
            if ok:
                page_ok += 1
                continue
            failures.append(f"{name}:{block.line}: sh block failed: {why}; its output's tail:\n{tail(out)}")
            if not args.keep_going:
                left = len(runnable) - i - 1
                if left:
                    print(f"{name}: {left} later sh block(s) skipped after the failure at line {block.line}")
                break
        print(f"{name}: {page_ok} of {len(runnable)} sh blocks passed ({time.monotonic() - started:.1f} s; "
              f"scratch folder {os.path.relpath(scratch, os.getcwd()) if scratch.startswith(os.getcwd()) else scratch})")

    if ran == 0:
        failures.append("no `sh` block found in " + ", ".join(n for n, _ in pages)
                        + ": nothing was run, so nothing was checked")
    sys.stdout.flush()
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr, flush=True)
    print(f"{len(pages)} page(s), {ran} sh block(s) {'found' if args.links_only else 'run'}, {shown_blocks} other block(s) not run, "
          f"{len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
