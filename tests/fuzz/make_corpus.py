"""Writes the fuzzers' binary seeds (torch.save files) into tests/fuzz/; the
JSON and --input seeds are text, written by hand. Run from the repository
root with Debian's python3-torch; the outputs are committed, so CI needs no
run of this.

  /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import collections

import torch

torch.manual_seed(0)
OUT = "tests/fuzz/torch_save/"

# The weights of tests/fuzz/json/linear.json (a Linear(2, 3)).
torch.save({"w": torch.randn(3, 2), "b": torch.randn(3)}, OUT + "linear.pt")
# One key: Python's pickler writes SETITEM, not SETITEMS.
torch.save({"x": torch.arange(6, dtype=torch.int64).reshape(2, 3)}, OUT + "one.pt")
# Every dtype the reader takes, a view sharing storage, containers and scalars.
base = torch.randn(4, 4)
torch.save(collections.OrderedDict([
    ("f64", torch.randn(2, dtype=torch.float64)), ("f16", torch.randn(3).half()),
    ("bf16", torch.randn(3).bfloat16()), ("i32", torch.tensor([1, -2], dtype=torch.int32)),
    ("i8", torch.tensor([3], dtype=torch.int8)), ("u8", torch.tensor([250], dtype=torch.uint8)),
    ("bool", torch.tensor([True, False])), ("base", base), ("view", base[1:, ::2]),
    ("scalar", torch.tensor(2.5)), ("empty", torch.zeros(0, 3)),
]), OUT + "dtypes.pt")
torch.save({"step": 3, "lr": 0.5, "name": "adam", "none": None, "flags": [True, False],
            "pair": (1, "a"), "nested": {"t": torch.ones(2)}}, OUT + "mixed.pt")

# --data seeds: NumPy arrays as .npy (one array) and an uncompressed .npz (two).
import numpy as np  # noqa: E402

NUMPY = "tests/fuzz/numpy/"
np.save(NUMPY + "x.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
np.save(NUMPY + "tokens.npy", np.arange(8, dtype=np.int64).reshape(2, 4))
np.savez(NUMPY + "pair.npz", x=np.ones((2, 3), dtype=np.float32), y=np.array([1, 0], dtype=np.int64))
