"""Tracing a train step with make_fx and writing it as an spmd graph dump."""
import collections
import contextlib
import importlib
import json
import os
import traceback

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.utils import stateless
from torch.utils import _foreach_utils

from ._convert import convert


_HERE = os.path.dirname(os.path.abspath(__file__))


class SpmdExportError(Exception):
    """A train step, model or optimizer that cannot be exported, and why."""


def _where(e, skip_ours=True):
    """' (at FILE:LINE)' of the innermost frame of `e`'s traceback in the
    user's code (outside torch and, with skip_ours, spmd_export), or ''."""
    skip = (os.path.dirname(torch.__file__) + os.sep,) + ((_HERE + os.sep,) if skip_ours else ())
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if not frame.filename.startswith("<") and not os.path.abspath(frame.filename).startswith(skip):
            return f" (at {frame.filename}:{frame.lineno})"
    return ""


def describe(e, skip_ours=True):
    """An exception as one line: 'TypeError: first line of message (at FILE:LINE)'."""
    text = str(e).strip().splitlines()
    return type(e).__name__ + (f": {text[0]}" if text else "") + _where(e, skip_ours)


def _reads_values(e):
    """Whether make_fx failed because traced code read a tensor's value."""
    text = str(e)
    return isinstance(e, RuntimeError) and ("_local_scalar_dense" in text or "tracing tensor" in text
                                            or "data-dependent" in text)


def _failure(e):
    """What a failed trace of the user's step did, for 'the train step ...'."""
    if _reads_values(e):
        first = str(e).strip().splitlines()[0]
        # make_fx's own message advises make_fx's callers (symbolic tracing),
        # not spmd_export's; other messages say what read the value.
        detail = "" if "make_fx" in first else ": " + first
        return ("reads tensor values in Python (data-dependent control flow, .item(), bool(tensor)), which a static "
                "graph cannot express" + detail + _where(e))
    return "raised " + describe(e)


# ---- what is traced -----------------------------------------------------------

def _modules(model):
    """[(prefix, module)] for a module or a dict of modules (several models)."""
    if isinstance(model, torch.nn.Module):
        return [("", model)]
    if isinstance(model, dict) and all(isinstance(m, torch.nn.Module) for m in model.values()):
        return [(f"{k}.", m) for k, m in model.items()]
    raise SpmdExportError("model must be a torch.nn.Module or a dict of them")


def _unique(named):
    """[(name, tensor)] without a tensor's second and later names (tied
    weights; a module shared by several models): one input per tensor, named
    as named_parameters() names it."""
    seen = set()
    out = []
    for name, t in named:
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


def _bindings(modules, traced_of):
    """{prefix: {name: traced tensor}} for every name under which each module
    reaches a parameter or buffer, tied ones included: a tied name left out
    would keep the module's own tensor, which make_fx then records as a
    constant (and whose gradient would go to the user's model)."""
    out = {}
    for prefix, module in modules:
        named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
        out[prefix] = {n: traced_of[id(t)] for n, t in named}
    return out


def _optimizers(optimizer):
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for o in opts:
        if not isinstance(o, torch.optim.Optimizer):
            raise SpmdExportError(f"optimizer must be a torch.optim.Optimizer or a list of them, got {type(o).__name__}")
    return opts


def _batch(batch):
    """(names, tensors, rebuild) for a tensor, a tuple/list or a dict of tensors."""
    if isinstance(batch, torch.Tensor):
        return ["input"], [batch], lambda ts: ts[0]
    if isinstance(batch, dict):
        names = list(batch.keys())
        return [str(n) for n in names], list(batch.values()), lambda ts: dict(zip(names, ts))
    if isinstance(batch, (list, tuple)):
        kind = type(batch)
        return [f"input{i}" for i in range(len(batch))], list(batch), lambda ts: kind(ts)
    raise SpmdExportError("batch must be a tensor, a tuple/list or a dict of tensors")


def _initial_state(opt, param):
    """torch.optim's state for `param` as its first step creates it."""
    group = next(g for g in opt.param_groups if any(p is param for p in g["params"]))
    name = type(opt).__name__
    if isinstance(opt, torch.optim.SGD):
        if group["momentum"] == 0:
            return {}
        if group["dampening"] != 0:
            raise SpmdExportError("SGD with momentum and dampening != 0: its first step (buffer = gradient) differs "
                                  "from later ones, so no single traced step covers both; run one step before "
                                  "exporting, or use dampening=0")
        return {"momentum_buffer": torch.zeros_like(param, memory_format=torch.preserve_format)}
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        # The traced (tensor-step) update computes its bias corrections from
        # `step`; in float64 they round as eager's Python floats do.
        state = {"step": torch.tensor(0.0, dtype=torch.float64),
                 "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                 "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state
    raise SpmdExportError(f"{name} has no state yet: run one step before exporting (its state is then exported "
                          "as the initial state), or use SGD, Adam or AdamW")


def _optimizer_state(opts, named_params):
    """[(name, tensor)] of every optimizer state tensor, '<param>.<key>' named."""
    out = []
    for opt in opts:
        for group in opt.param_groups:
            for p in group["params"]:
                pname = next((n for n, q in named_params if q is p), None)
                if pname is None:
                    raise SpmdExportError(f"{type(opt).__name__} holds a parameter that is not the model's")
                state = opt.state.get(p) or _initial_state(opt, p)
                for key, value in state.items():
                    if not isinstance(value, torch.Tensor):
                        raise SpmdExportError(f"{type(opt).__name__} state '{key}' of {pname} is a Python "
                                              f"{type(value).__name__}; a traced step would freeze it")
                    out.append((f"{pname}.{key}", p, key, value.detach().clone()))
    return out


# ---- tracing --------------------------------------------------------------------

def _check_fused(opt, group):
    """fused=True for parameters on a device that has no fused kernel fails
    in eager too; say so before tracing, which runs the foreach path."""
    name = type(opt).__name__
    supported = _foreach_utils._get_fused_kernels_supported_devices()
    others = sorted({p.device.type for p in group["params"]} - set(supported))
    if others:
        raise SpmdExportError(f"{name}(fused=True) needs its parameters on {' or '.join(supported)}, not "
                              f"{', '.join(others)} (this PyTorch has no fused kernel for them); use foreach=True "
                              "or the default implementation")


def _all_true(_):
    return True


# Where torch.optim's foreach Adam/AdamW step asserts its device constraint:
# adam.py, and adamw.py where AdamW has its own implementation (torch 2.6;
# newer PyTorch runs AdamW as Adam with decoupled weight decay).
_ADAM_MODULES = ("torch.optim.adam", "torch.optim.adamw")


@contextlib.contextmanager
def _device_assert_lifted():
    """The capturable foreach Adam/AdamW step asserts that parameters and
    steps are on a CUDA-graph device: a constraint of CUDA graphs, not of the
    math. Shadowing `all` in those modules lifts it; during a step its only
    other use is a check that the steps are tensors, which ours are."""
    modules = [importlib.import_module(m) for m in _ADAM_MODULES]
    shadowed = [(m, m.__dict__.get("all")) for m in modules]
    for m, _ in shadowed:
        m.all = _all_true
    try:
        yield
    finally:
        for m, previous in shadowed:
            if previous is None:
                del m.all
            else:
                m.all = previous


def _make_traceable(opt, group):
    """Switches one param group to an update make_fx traces without .item();
    returns whether it needs the device assert lifted."""
    if group.get("fused"):
        group["fused"], group["foreach"] = False, True
    if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        return False
    if group.get("foreach"):
        group["capturable"] = True
        return True
    group["differentiable"] = True
    return False


@contextlib.contextmanager
def _traceable(opts):
    """Optimizer settings whose update make_fx can trace, without .item():
    - single-tensor Adam/AdamW: the tensor-step formulation (`differentiable`);
    - foreach Adam/AdamW: the foreach tensor-step formulation (`capturable`),
      with its device assert lifted (_device_assert_lifted);
    - fused: traced as foreach. The fused kernels are one opaque op whose
      arithmetic spmd would have to restate; the foreach path computes the
      same update through ATen ops (it rounds as foreach does, not as the
      fused kernel does).
    SGD's foreach path reads no tensor values and is traced as it is; its
    foreach ops are expanded per tensor by the converter. Everything changed
    is put back afterwards."""
    for opt in opts:  # before anything is changed
        for group in opt.param_groups:
            if group.get("fused"):
                _check_fused(opt, group)
    saved = [(group, dict(group)) for opt in opts for group in opt.param_groups]
    try:
        lift = False
        for opt in opts:
            for group in opt.param_groups:
                lift = _make_traceable(opt, group) or lift
        with _device_assert_lifted() if lift else contextlib.nullcontext():
            yield
    finally:
        for group, values in saved:
            group.clear()
            group.update(values)


@contextlib.contextmanager
def _installed(modules, opts, named_params, named_buffers, state_entries, params, buffers, states, grads):
    """Puts the traced tensors into the modules and optimizers for the
    duration of the step, and records the gradients optimizer.step() sees."""
    traced_of = {id(p): t for (_, p), t in zip(named_params + named_buffers, list(params) + list(buffers))}
    by_prefix = _bindings(modules, traced_of)
    saved = []
    with contextlib.ExitStack() as stack:
        for prefix, module in modules:
            stack.enter_context(stateless._reparametrize_module(module, by_prefix[prefix]))
        for opt in opts:
            saved.append((opt, [list(g["params"]) for g in opt.param_groups], opt.state))
            new_state = collections.defaultdict(dict)
            for (_, p, key, _), t in zip(state_entries, states):
                if any(p is q for g in opt.param_groups for q in g["params"]):
                    new_state[traced_of[id(p)]][key] = t
            for group in opt.param_groups:
                group["params"] = [traced_of[id(p)] for p in group["params"]]
            opt.state = new_state
            original_step = opt.step

            def recording_step(*args, _opt=opt, _step=original_step, **kwargs):
                for group in _opt.param_groups:
                    for t in group["params"]:
                        # A fresh detach marks the gradient as optimizer.step()
                        # reads it (the converter resolves the mark to it).
                        grads.setdefault(id(t), None if t.grad is None else t.grad.detach())
                try:
                    return _step(*args, **kwargs)
                except SpmdExportError:
                    raise
                except Exception as e:  # named here: the optimizer, not the user's step, is the cause
                    what = ("reads tensor values in Python (its step count with .item(), say), which a static graph "
                            "cannot express" if _reads_values(e) else "raised " + describe(e))
                    raise SpmdExportError(f"{type(_opt).__name__}.step() {what}; spmd_export traces SGD, Adam, AdamW "
                                          "and optimizers whose step is tensor ops only") from e

            opt.step = recording_step
        try:
            yield
        finally:
            for opt, group_params, state in saved:
                del opt.step
                for group, ps in zip(opt.param_groups, group_params):
                    group["params"] = ps
                opt.state = state


def _trace(train_step, model, optimizer, batch):
    modules = _modules(model)
    opts = _optimizers(optimizer)
    named_params = _unique((pf + n, p) for pf, m in modules for n, p in m.named_parameters())
    named_buffers = _unique((pf + n, b) for pf, m in modules for n, b in m.named_buffers())
    state_entries = _optimizer_state(opts, named_params)
    batch_names, batch_tensors, rebuild = _batch(batch)
    grads = {}
    outputs = {}

    def step(params, buffers, states, data):
        grads.clear()
        with _installed(modules, opts, named_params, named_buffers, state_entries, params, buffers, states, grads):
            loss = train_step(model, optimizer, rebuild(data))
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise SpmdExportError("the train step must return the loss as a scalar tensor")
        outputs["grads"] = [grads.get(id(p)) for p in params]
        return [loss] + [g for g in outputs["grads"] if g is not None]

    params = [p.detach().clone().requires_grad_(p.requires_grad) for _, p in named_params]
    buffers = [b.detach().clone() for _, b in named_buffers]
    # Tracing runs the step on these tensors and updates them in place; the
    # weights file keeps the untouched initial values.
    states = [s.clone() for (_, _, _, s) in state_entries]
    try:
        with _traceable(opts):
            gm = make_fx(step)(params, buffers, states, [t.detach() for t in batch_tensors])
    except SpmdExportError:
        raise
    except Exception as e:  # the user's step, model or loss failed while traced
        raise SpmdExportError("the train step " + _failure(e)) from e
    inputs = ([(n, "parameter", p.requires_grad) for (n, p) in named_params]
              + [(n, "buffer", False) for n, _ in named_buffers]
              + [(n, "state", False) for (n, _, _, _) in state_entries]
              + [(n, "data", False) for n in batch_names])
    grad_params = [n for (n, _), g in zip(named_params, outputs["grads"]) if g is not None]
    tensors = ({n: p.detach().clone() for n, p in named_params}
               | {n: b.detach().clone() for n, b in named_buffers}
               | {n: s for (n, _, _, s) in state_entries})
    return gm, inputs, grad_params, tensors


# ---- writing --------------------------------------------------------------------

def _dump(doc):
    """Writes like spmd's own writer: one array element per line."""
    lines = ["{", f'  "format": "spmd-graph",', f'  "version": 1,',
             f'  "weights": {json.dumps(doc["weights"], separators=(",", ":"))},']
    keys = ["inputs", "nodes", "outputs", "updates", "gradients"]
    for i, key in enumerate(keys):
        items = doc[key]
        body = ",\n    ".join(json.dumps(item, separators=(",", ":"), allow_nan=False) for item in items)
        lines.append(f'  "{key}": [' + (f"\n    {body}\n  ]" if items else "]") + ("," if i < len(keys) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def export(train_step, model, optimizer, batch, path, weights_path=None):
    """Traces `train_step(model, optimizer, batch)` and writes the dump to
    `path` and parameters, buffers and initial optimizer state to
    `weights_path` (default: `path` with .weights.pt). The model and optimizer
    are left as they were. Raises SpmdExportError naming the cause."""
    if weights_path is None:
        weights_path = os.path.splitext(path)[0] + ".weights.pt"
    gm, inputs, grad_params, tensors = _trace(train_step, model, optimizer, batch)
    try:
        doc = convert(gm, inputs, grad_params, SpmdExportError)
    except SpmdExportError:
        raise
    except Exception as e:  # a bug of ours; still one line, with where it happened
        raise SpmdExportError("internal error converting the traced step (please report): "
                              + describe(e, skip_ours=False)) from e
    # spmd reads a relative weights path relative to the dump's directory.
    named = weights_path if os.path.isabs(weights_path) else os.path.relpath(weights_path, os.path.dirname(path) or ".")
    doc["weights"] = {"file": named, "format": "torch.save"}
    writes = ((weights_path, lambda f: torch.save(tensors, f)), (path, lambda f: f.write(_dump(doc).encode())))
    try:
        for target, write in writes:
            with open(target + ".tmp", "wb") as f:
                write(f)
        for target, _ in writes:
            os.replace(target + ".tmp", target)
    except OSError as e:
        for target, _ in writes:  # no partial output
            with contextlib.suppress(OSError):
                os.remove(target + ".tmp")
        raise SpmdExportError(f"cannot write {e.filename or path}: {e.strerror or e}") from None
    return doc


def _forward_arguments(batch):
    """model(*batch), model(**batch) or model(batch), as (args, kwargs)."""
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    if isinstance(batch, dict):
        return (), dict(batch)
    return (batch,), {}


def export_program(model, batch, path):
    """Writes `model`'s forward on `batch` (model(*batch) for a tuple or list,
    model(**batch) for a dict), which must return the loss, as a torch.export
    program (.pt2, the training IR of torch.export.export) to `path`. The
    optimizer is spmd-expand's to add. Raises SpmdExportError naming the cause."""
    args, kwargs = _forward_arguments(batch)
    try:
        program = torch.export.export(model, args, kwargs)
    except Exception as e:
        raise SpmdExportError(f"torch.export.export failed: {describe(e)}") from None
    outputs = [spec.arg.name for spec in program.graph_signature.output_specs
               if spec.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT]
    values = {node.name: node.meta.get("val") for node in program.graph.nodes}
    loss = values.get(outputs[0]) if outputs else None
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
        got = "nothing" if not outputs else f"{type(loss).__name__}" if not isinstance(loss, torch.Tensor) else \
            f"a {loss.dtype} tensor of shape {list(loss.shape)}"
        raise SpmdExportError(f"the model's forward must return the loss (a floating scalar) first, got {got}")
    try:
        with open(path + ".tmp", "wb") as f:
            torch.export.save(program, f)
        os.replace(path + ".tmp", path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        raise SpmdExportError(f"cannot write {e.filename or path}: {e.strerror or e}") from None
    return program
