"""Compares two torch.save'd {name: tensor} parameter dicts.

  compare_params.py OURS.pt REF.pt [--rtol 1e-4] [--atol 1e-6]

Checks that both hold the same names and that every pair of tensors has the
same shape and is close (torch.allclose(ours, ref, rtol, atol), which is
|ours - ref| <= atol + rtol * |ref|). Prints one line per parameter that
differs, with its max abs diff and max rel diff (relative to |ref|), then a
final line; exits 1 on any mismatch, 2 when a file cannot be read.
"""
import argparse
import sys

import torch


def as_dict(obj, path):
    if isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        return obj
    raise ValueError(f"{path}: expected a {{name: tensor}} dict, got {type(obj).__name__}")


def diffs(ours, ref):
    """(max abs diff, max rel diff) in float64."""
    o, r = ours.detach().double(), ref.detach().double()
    if o.numel() == 0:
        return 0.0, 0.0
    abs_diff = (o - r).abs()
    rel = abs_diff / r.abs().clamp_min(torch.finfo(torch.float64).tiny)
    rel = torch.where(abs_diff == 0, torch.zeros_like(rel), rel)
    return abs_diff.max().item(), rel.max().item()


def compare(ours, ref, rtol, atol, out=sys.stdout):
    """Prints the mismatches; returns how many there are."""
    bad = 0
    for name in sorted(set(ours) - set(ref)):
        print(f"{name}: only in ours", file=out)
        bad += 1
    for name in sorted(set(ref) - set(ours)):
        print(f"{name}: only in ref", file=out)
        bad += 1
    worst_abs, worst_rel = 0.0, 0.0
    for name in [n for n in ref if n in ours]:
        o, r = ours[name], ref[name]
        if tuple(o.shape) != tuple(r.shape):
            print(f"{name}: shape {list(o.shape)} vs ref {list(r.shape)}", file=out)
            bad += 1
            continue
        if o.dtype != r.dtype:
            print(f"{name}: dtype {o.dtype} vs ref {r.dtype}", file=out)
            bad += 1
            continue
        if r.is_floating_point():
            a, rl = diffs(o, r)
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, rl)
            finite_ok = torch.equal(torch.isfinite(o), torch.isfinite(r))
            if not finite_ok or not torch.allclose(o, r, rtol=rtol, atol=atol, equal_nan=True):
                print(f"{name}: max abs diff {a:.3e}, max rel diff {rl:.3e}"
                      + ("" if finite_ok else " (non-finite values differ)"), file=out)
                bad += 1
        elif not torch.equal(o, r):
            print(f"{name}: integer values differ", file=out)
            bad += 1
    total = len(set(ours) | set(ref))
    if bad:
        print(f"MISMATCH: {bad} of {total} parameters differ (rtol {rtol:g}, atol {atol:g}; "
              f"worst abs {worst_abs:.3e}, worst rel {worst_rel:.3e})", file=out)
    else:
        print(f"OK: {total} parameters match (rtol {rtol:g}, atol {atol:g}; "
              f"worst abs {worst_abs:.3e}, worst rel {worst_rel:.3e})", file=out)
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ours")
    p.add_argument("ref")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-6)
    a = p.parse_args()
    try:
        ours = as_dict(torch.load(a.ours, map_location="cpu"), a.ours)
        ref = as_dict(torch.load(a.ref, map_location="cpu"), a.ref)
    except Exception as e:  # unreadable or not a dict of tensors
        print(f"compare_params.py: {e}", file=sys.stderr)
        return 2
    return 1 if compare(ours, ref, a.rtol, a.atol) else 0


if __name__ == "__main__":
    sys.exit(main())
