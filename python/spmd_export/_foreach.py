"""Expands torch.optim's multi-tensor ops (aten::_foreach_*) in a make_fx
graph into the per-tensor ATen ops they stand for.

A foreach op takes whole tensor lists (`_foreach_add_.List(params, grads,
alpha=-lr)`), which the graph dump cannot express; each element's math is one
ordinary op (`add_.Tensor(params[i], grads[i], alpha=-lr)`). The per-tensor op
is found by the foreach op's own schema: `_foreach_X` becomes `X` with each
list argument replaced by its i-th element and every other argument (a Scalar,
a broadcast Tensor) passed unchanged, in list order, so every element sees the
same op and the same scalars as ATen's per-tensor foreach loop computes with.
In-place foreach ops become in-place per-tensor ops, which the converter makes
functional as it does any other; where ATen has no in-place form
(`_foreach_maximum_`), the element is computed out of place and copied back,
as ATen's own loop does. Results of out-of-place foreach ops are read through
`operator.getitem` nodes, which are replaced by the per-tensor results.

Fused optimizer kernels (aten::_fused_adam_ and kin) are one op for a whole
update whose arithmetic is not any ATen op's: they are rejected here (the
exporter traces fused optimizers through their foreach implementation).
"""
import operator

import torch
import torch.fx


# Foreach ops whose per-tensor loop in ATen calls an op of another name.
_PER_TENSOR_NAME = {"norm": "linalg_vector_norm"}
# torch.optim's fused kernels (in place and functional forms).
_FUSED_OPTIMIZERS = {"fused_adam", "fused_adamw", "fused_sgd", "fused_adagrad"}


def _is_list(formal):
    return str(formal.type).startswith("List[")


def _element_type(formal):
    """The per-element type of a foreach argument: Tensor[] -> Tensor."""
    text = str(formal.type)
    return text[len("List["):-1] if _is_list(formal) else text


def _has_default(formal):
    return formal.default_value is not None or str(formal.type).startswith("Optional[")


def _per_tensor(packet, element_types):
    """The overload of `packet` whose leading arguments have `element_types`
    and whose remaining ones all have defaults (fewest extra first)."""
    found = []
    for name in packet.overloads():
        schema = getattr(packet, name)._schema
        formals = schema.arguments
        if len(formals) < len(element_types) or any(a.alias_info is not None and a.alias_info.is_write
                                                    for a in formals[1:]):
            continue
        if all(str(f.type) in (t, f"Optional[{t}]") for f, t in zip(formals, element_types)) and \
                all(_has_default(f) for f in formals[len(element_types):]):
            found.append((len(formals), name))
    return getattr(packet, min(found)[1]) if found else None


def _meta_tensor(node):
    meta = node.meta["val"]
    return torch.empty([int(d) for d in meta.shape], dtype=meta.dtype, device="meta")


def _expand(gm, node, error):
    schema = node.target._schema
    base = schema.name.split("::")[1][len("_foreach_"):]
    base = _PER_TENSOR_NAME.get(base, base)
    formals = schema.arguments
    values = [node.args[i] if i < len(node.args) else node.kwargs.get(f.name, f.default_value)
              for i, f in enumerate(formals)]
    lists = [i for i, f in enumerate(formals) if _is_list(f)]
    if not lists:
        raise error(f"{node.name}: {schema.name}.{schema.overload_name} has no tensor list to expand")
    count = len(values[lists[0]])
    if any(len(values[i]) != count for i in lists):
        raise error(f"{node.name}: {schema.name} called with lists of different lengths")
    types = [_element_type(f) for f in formals]
    in_place = base.endswith("_")
    copy_back = False
    packet = getattr(torch.ops.aten, base, None)
    op = _per_tensor(packet, types) if packet is not None else None
    if op is None and in_place:
        # No in-place per-tensor op: ATen's loop computes out of place and copies back.
        packet = getattr(torch.ops.aten, base[:-1], None)
        op = _per_tensor(packet, types) if packet is not None else None
        copy_back = True
    if op is None:
        raise error(f"{node.name}: {schema.name}.{schema.overload_name} has no per-tensor ATen op that spmd "
                    "could expand it into")
    results = {u.args[1]: u for u in node.users if u.target is operator.getitem}
    if len(results) != len(node.users):
        raise error(f"{node.name}: the result list of {schema.name} is used other than element by element")
    op_formals = op._schema.arguments
    graph = gm.graph
    with graph.inserting_before(node):
        for i in range(count):
            if not in_place and i not in results:
                continue  # an element nobody reads
            element = [v[i] if k in lists else v for k, v in enumerate(values)]
            args = tuple(v for f, v in zip(op_formals, element) if not f.kwarg_only)
            kwargs = {f.name: v for f, v in zip(op_formals, element) if f.kwarg_only}
            new = graph.call_function(op, args, kwargs)
            if in_place:
                target = element[0]
                if copy_back:
                    new.meta["val"] = op(*[_meta_tensor(a) if isinstance(a, torch.fx.Node) else a for a in args],
                                         **kwargs)
                    graph.call_function(torch.ops.aten.copy_.default, (target, new)).meta = dict(target.meta)
                else:
                    new.meta = dict(target.meta)
            else:
                new.meta = dict(results[i].meta)
                results[i].replace_all_uses_with(new)
                graph.erase_node(results[i])
    graph.erase_node(node)


def expand_foreach(gm, error):
    """Rewrites `gm` (in place) without foreach ops; returns it."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name = node.target._schema.name
        if name.startswith("aten::_foreach_"):
            _expand(gm, node, error)
            changed = True
        elif name.split("::")[1].strip("_") in _FUSED_OPTIMIZERS:
            raise error(f"{node.name}: {name} is a fused optimizer kernel, which spmd_export cannot restate as "
                        "ATen ops; use the optimizer's foreach or default implementation")
    if changed:
        gm.recompile()
    return gm
