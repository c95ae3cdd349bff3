"""spmd_export: Python train steps as spmd JSON graph dumps.

A train step is a function ``step(model, optimizer, batch)`` that runs the
forward, calls ``loss.backward()``, ``optimizer.step()`` and usually
``optimizer.zero_grad()``, and returns the loss. ``export`` traces it with
make_fx into ATen ops (forward, backward and the optimizer update), with
parameters, buffers, optimizer state and the batch as graph inputs and every
in-place update made explicit, and writes:

* a JSON graph dump (``schemas/graph.schema.json``) whose ``gradients`` table
  says which value is the gradient of which parameter, so that spmd-split can
  bucket and all-reduce them as it does for spmd-expand's output;
* a ``torch.save`` file with the parameters, buffers and initial optimizer
  state, by name, that the dump references.

``export_program(model, batch, path)`` writes only the model's forward, which
returns the loss, as a torch.export program (.pt2) for spmd-expand, which adds
the backward and the optimizer.

Works with the user's own PyTorch, 2.6 or later.
"""
from ._export import SpmdExportError, export, export_program

__all__ = ["export", "export_program", "SpmdExportError"]
