"""Exports a sample's train step with spmd_export (make_fx), for the parity
cases that enter the pipeline at spmd-split instead of spmd-expand.

  export_step.py --sample mlp|lm|cnn --optimizer sgd|adam|adamw --lr F [--momentum F]
      [--weight-decay F] [--nesterov] [--eps F] --out STEP.json

The model is the sample's class with the TorchScript sample's weights (as
ddp_reference.py builds it); the example batch has the per-rank shapes of
samples/X.inputs.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "samples"), HERE]

import spmd_export  # noqa: E402
from ddp_reference import parse_spec  # noqa: E402
from models import SAMPLES  # noqa: E402


def train_step(model, optimizer, batch):
    loss = model(**batch)  # keyed by the forward's argument names, as the data file is
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sample", required=True)
    p.add_argument("--optimizer", required=True, choices=["sgd", "adam", "adamw"])
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    make, specs = SAMPLES[a.sample]
    model = make()
    model.load_state_dict(torch.jit.load(os.path.join(ROOT, "samples", a.sample + ".pt")).state_dict())
    model.train()
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                              weight_decay=a.weight_decay or 0.0)
    else:
        kind = torch.optim.Adam if a.optimizer == "adam" else torch.optim.AdamW
        wd = a.weight_decay if a.weight_decay is not None else (0.0 if a.optimizer == "adam" else 1e-2)
        opt = kind(model.parameters(), lr=a.lr, eps=a.eps, weight_decay=wd)
    batch = {}
    for spec in specs:
        name, dtype, shape = parse_spec(spec)
        batch[name] = torch.zeros(shape, dtype=dtype) if not dtype.is_floating_point else torch.randn(shape)
    spmd_export.export(train_step, model, opt, batch, a.out)


if __name__ == "__main__":
    main()
