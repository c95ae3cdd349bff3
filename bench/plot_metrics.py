"""Draws spmd-run --metrics FILE.jsonl as an SVG: the loss (and its moving
average) against the step, with the validation loss (spmd-run --eval) as
points joined by a line where the run evaluated, and below it the learning rate and, where the
run clips, the gradient norm. Python's standard library only; the same
input gives the same bytes.

  plot_metrics.py METRICS.jsonl -o OUT.svg [--title TEXT] [--smooth K]
"""
import argparse
import json
import math
import sys

WIDTH, PANEL, MARGIN_L, MARGIN_R, MARGIN_T, GAP = 720, 220, 64, 24, 36, 56


def read(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: error: {path}:{n}: not a JSON object: {e.msg}")
    rows = [r for r in rows if isinstance(r, dict) and "step" in r]
    if not rows:
        sys.exit(f"plot_metrics: error: {path}: no step lines")
    # A resumed run appends the steps it repeats: the last line of a step wins.
    by_step = {r["step"]: r for r in rows}
    return [by_step[s] for s in sorted(by_step)]


def moving_average(values, k):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= k:
            total -= values[i - k]
        out.append(total / min(i + 1, k))
    return out


def ticks(lo, hi, count=5):
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)], step


def fmt(v, step):
    digits = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return f"{v:.{digits}f}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"


class Panel:
    def __init__(self, top, steps, lo, hi):
        self.top, self.x0, self.x1 = top, steps[0], steps[-1] if steps[-1] > steps[0] else steps[0] + 1
        pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
        self.lo, self.hi = lo - pad, hi + pad

    def x(self, step):
        return MARGIN_L + (step - self.x0) / (self.x1 - self.x0) * (WIDTH - MARGIN_L - MARGIN_R)

    def y(self, v):
        return self.top + PANEL - (v - self.lo) / (self.hi - self.lo) * PANEL

    def frame(self, label):
        out = [f'<rect x="{MARGIN_L}" y="{self.top}" width="{WIDTH - MARGIN_L - MARGIN_R}" height="{PANEL}" '
               'fill="none" stroke="#888"/>']
        values, step = ticks(self.lo, self.hi)
        for v in values:
            out.append(f'<line x1="{MARGIN_L - 4}" y1="{self.y(v):.1f}" x2="{MARGIN_L}" y2="{self.y(v):.1f}" stroke="#888"/>')
            out.append(f'<text x="{MARGIN_L - 6}" y="{self.y(v) + 4:.1f}" text-anchor="end">{fmt(v, step)}</text>')
        xs, xstep = ticks(self.x0, self.x1)
        for s in xs:
            out.append(f'<line x1="{self.x(s):.1f}" y1="{self.top + PANEL}" x2="{self.x(s):.1f}" '
                       f'y2="{self.top + PANEL + 4}" stroke="#888"/>')
            out.append(f'<text x="{self.x(s):.1f}" y="{self.top + PANEL + 16}" text-anchor="middle">{int(s)}</text>')
        out.append(f'<text x="{MARGIN_L + 6}" y="{self.top + 16}">{label}</text>')
        return out

    def line(self, steps, values, colour, width=1.5):
        points = " ".join(f"{self.x(s):.1f},{self.y(v):.1f}" for s, v in zip(steps, values) if math.isfinite(v))
        return [f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="{width}"/>']


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--title", default="")
    p.add_argument("--smooth", type=int, default=20, help="moving-average window of the loss (20)")
    a = p.parse_args()
    rows = read(a.metrics)
    steps = [r["step"] for r in rows]
    loss = [r["loss"] if r.get("loss") is not None else float("nan") for r in rows]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None and math.isfinite(r["val_loss"])]
    finite = [v for v in loss if math.isfinite(v)] + [v for _, v in val] or [0.0]
    lower = [("lr", [r.get("lr") for r in rows], "#d62728")]
    if any(r.get("grad_norm") is not None for r in rows):
        lower.append(("grad norm", [r.get("grad_norm") for r in rows], "#2ca02c"))
    height = MARGIN_T + PANEL + GAP + (PANEL + GAP) * len([1 for _, v, _ in lower if any(x is not None for x in v)])
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
           'font-size="11">', f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="13">{a.title}</text>']
    top = Panel(MARGIN_T, steps, min(finite), max(finite))
    svg += top.frame(f"loss (per step; moving average of {a.smooth})")
    svg += top.line(steps, loss, "#aec7e8", 1)
    svg += top.line(steps, moving_average([v if math.isfinite(v) else 0.0 for v in loss], a.smooth), "#1f77b4", 2)
    if val:
        svg += top.line([s for s, _ in val], [v for _, v in val], "#ff7f0e", 2)
        svg += [f'<circle cx="{top.x(s):.1f}" cy="{top.y(v):.1f}" r="3" fill="#ff7f0e"/>' for s, v in val]
        svg.append(f'<text x="{WIDTH - MARGIN_R - 6}" y="{MARGIN_T + 16}" text-anchor="end" fill="#ff7f0e">'
                   'validation loss</text>')
    y = MARGIN_T + PANEL + GAP
    for label, values, colour in lower:
        present = [(s, v) for s, v in zip(steps, values) if v is not None]
        if not present:
            continue
        panel = Panel(y, steps, min(v for _, v in present), max(v for _, v in present))
        svg += panel.frame(label)
        svg += panel.line([s for s, _ in present], [v for _, v in present], colour)
        y += PANEL + GAP
    svg.append(f'<text x="{WIDTH / 2}" y="{height - 8}" text-anchor="middle">step</text>')
    svg.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
