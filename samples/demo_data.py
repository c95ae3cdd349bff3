"""Fixed training data for `make demo`: one global batch that every step
reuses (slice s % 1), so the loss falls as the model fits it. Random inputs
drawn afresh each step (spmd-run without --data) give a loss that wanders.

  demo_data.py OUT_DIR        writes OUT_DIR/cnn_data.pt and OUT_DIR/lm_data.pt

Shapes follow spmd-run's data contract [S, G, ...] for 2 ranks: the CNN takes
x:f32[8,3,16,16], y:f32[8,4] per rank; the LM, with 4 micro-batches of
tokens:i64[4,16], takes 16 rows per rank.
"""
import os
import sys

import torch


def main():
    out = sys.argv[1]
    g = torch.Generator().manual_seed(0)
    ranks = 2
    torch.save({"x": torch.randn(1, 8 * ranks, 3, 16, 16, generator=g),
                "y": torch.randn(1, 8 * ranks, 4, generator=g)}, os.path.join(out, "cnn_data.pt"))
    # The next-token task on repeating sequences: learnable, so the loss falls.
    start = torch.randint(0, 64, (1, 16 * ranks, 1), generator=g)
    seq = (start + torch.arange(17).view(1, 1, 17)) % 64
    torch.save({"tokens": seq[..., :16].contiguous(), "targets": seq[..., 1:].contiguous()},
               os.path.join(out, "lm_data.pt"))


if __name__ == "__main__":
    main()
