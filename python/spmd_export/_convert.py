"""FX graph (from make_fx) -> spmd graph dump (a dict shaped by
schemas/graph.schema.json).

make_fx records in-place ATen ops (the optimizer's param.addcdiv_, the state's
exp_avg.mul_, ...). Each becomes its out-of-place form, and later readers of
the mutated tensor read the new value (SSA renaming); graph inputs written
this way become state updates. A write through a view also gives the view's
bases their new values (_views.py); other views of the written tensor that
are read after the write (and would observe it) are rejected. Multi-tensor
(foreach) ops are first expanded into per-tensor ops (_foreach.py).
"""
import math
import operator

import torch
import torch.fx

from . import _views
from ._foreach import expand_foreach

# Ops whose result aliases their first argument (with those whose schema says
# so: _views.is_view; _unsafe_view's does not).
_VIEW_OPS = {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::t", "aten::transpose", "aten::permute",
             "aten::expand", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::as_strided",
             "aten::detach", "aten::alias", "aten::split", "aten::chunk", "aten::unbind", "aten::narrow",
             "aten::diagonal", "aten::view_as", "aten::expand_as", "aten::split_with_sizes"}
_MEMORY_FORMATS = {torch.contiguous_format: "contiguous_format", torch.preserve_format: "preserve_format",
                   torch.channels_last: "channels_last", torch.channels_last_3d: "channels_last_3d"}
_BATCH_NORMS = {"aten::native_batch_norm", "aten::_native_batch_norm_legit"}


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _float(x):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def _tensor_metas(node):
    """[(dtype, shape)] of a node's results, from make_fx's metadata."""
    meta = node.meta.get("val")
    items = [meta] if meta is None or isinstance(meta, torch.Tensor) else list(meta)
    out = []
    for m in items:
        if m is None:
            out.append(None)
        else:
            out.append((_dtype_name(m.dtype), [int(d) for d in m.shape]))
    return out


def _drop_profiler_ranges(gm):
    """make_fx on torch 2.x records optimizer.step's record_function range as
    profiler ops (an enter returning a handle, an exit taking it): side effects
    for the profiler only, dropped."""
    graph = gm.graph
    ranges = [n for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
              and n.target._schema.name.startswith("profiler::")]
    for node in reversed(ranges):  # exits (the handles' users) first
        if not node.users:
            graph.erase_node(node)
    if ranges:
        gm.recompile()
    return gm


def _has_items(node):
    """Whether an op's results are read item by item (getitem): several
    results, or a Tensor[] (split, unbind)."""
    returns = node.target._schema.returns
    return len(returns) != 1 or str(returns[0].type).startswith("List[")


def _out_of_place(base_op, schema, overload):
    """The overload of `base_op` (add for add_) that computes what the
    in-place op `schema` writes: the one of the same name, else the one with
    the same arguments (transpose_ has no transpose.default, but
    transpose.int); None where there is none."""
    packet = getattr(torch.ops.aten, base_op.split("::")[1], None)
    if packet is None:
        return None
    if (overload or "default") in packet.overloads():
        return overload
    formals = [(a.name, str(a.type)) for a in schema.arguments]
    for name in packet.overloads():
        if [(a.name, str(a.type)) for a in getattr(packet, name)._schema.arguments] == formals:
            return "" if name == "default" else name
    return None


class _Converter:
    def __init__(self, gm, error):
        self.gm = gm
        self.error = error
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.current = {}    # fx node -> name of its value now (after in-place updates)
        self.original = {}   # fx node -> name of the value it was created with
        self.root = {}       # fx node -> the fx node whose storage it views
        self.same = {}       # in-place op's fx node -> the tensor it updated (one tensor, two fx nodes)
        self.view_of = {}    # view's fx node -> (source fx node, op, overload, dump args, result index)
        self.nodes = []
        self.types = {}      # value name -> (dtype, shape)

    def fail(self, node, what):
        raise self.error(f"{node.name}: {what}")

    # ---- values -----------------------------------------------------------------

    def define(self, node, name, dtype_shape):
        self.current[node] = name
        self.original.setdefault(node, name)
        self.types[name] = dtype_shape

    def tensor_of(self, node):
        return self.same.get(node, node)

    def ref(self, node, user):
        node = self.tensor_of(node)
        if node not in self.current:
            self.fail(user, f"uses {node.name}, which is not a tensor value")
        return self.current[node]

    def arg(self, value, type_str, user):
        if type_str in ("Tensor", "Optional[Tensor]") and isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"value": self.scalar_tensor(value, user)}
        if isinstance(value, torch.fx.Node):
            return {"value": self.ref(value, user)}
        if isinstance(value, (list, tuple)):
            if any(isinstance(v, torch.fx.Node) for v in value):
                if not all(isinstance(v, torch.fx.Node) for v in value):
                    self.fail(user, "a tensor list with holes is not supported")
                return {"values": [self.ref(v, user) for v in value]}
            if "Tensor" in type_str:
                return {"values": []}
            if "bool" in type_str or (value and all(isinstance(v, bool) for v in value)):
                return {"bools": [bool(v) for v in value]}
            if "float" in type_str or any(isinstance(v, float) for v in value):
                return {"floats": [_float(v) for v in value]}
            return {"ints": [int(v) for v in value]}
        if value is None:
            return {"none": None}
        if isinstance(value, bool):
            return {"bool": value}
        if isinstance(value, int):
            return {"float": float(value)} if type_str in ("float", "Optional[float]") else {"int": value}
        if isinstance(value, float):
            return {"float": _float(value)}
        if isinstance(value, str):
            return {"str": value}
        if isinstance(value, torch.dtype):
            return {"dtype": _dtype_name(value)}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, torch.layout):
            return {"layout": "strided" if value == torch.strided else str(value).replace("torch.", "")}
        if isinstance(value, torch.memory_format):
            return {"memory_format": _MEMORY_FORMATS[value]}
        self.fail(user, f"argument of unsupported type {type(value).__name__}")

    def scalar_tensor(self, value, user):
        """A Python number where the op takes a tensor (make_fx keeps
        x.mul_(0.9) as mul.Tensor(x, 0.9)): a 0-dim tensor of the dtype type
        promotion would give the op's tensor operand and that number."""
        tensor_dtypes = [m[0] for a in user.args if isinstance(a, torch.fx.Node) and a in self.current
                         for m in [self.types[self.current[a]]]]
        base = getattr(torch, tensor_dtypes[0]) if tensor_dtypes else torch.get_default_dtype()
        dtype = torch.result_type(torch.empty(0, dtype=base), value)
        name = f"{user.name}_scalar{len(self.nodes)}"
        self.types[name] = (_dtype_name(dtype), [])
        literal = {"float": _float(value)} if isinstance(value, float) else {"int": value}
        self.emit("aten::scalar_tensor", "", [literal, {"dtype": _dtype_name(dtype)}, {"none": None}, {"none": None},
                                              {"none": None}], [name], user)
        return name

    def constant(self, node):
        """A get_attr of a 0-dim tensor constant (the foreach Adam/AdamW step
        adds torch.tensor(1.0) to its step counts on CPU): an
        aten::scalar_tensor of its dtype and value."""
        value = getattr(self.gm, node.target, None)
        if isinstance(value, torch.nn.Parameter):
            # make_fx records a parameter it was not given as an input as a
            # constant: frozen, and its gradient lost.
            self.fail(node, f"reads a parameter of shape {list(value.shape)} that is not one of the model's "
                            "parameters; pass every module the step uses in `model` (a dict of modules for several)")
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            self.fail(node, f"reads a tensor of shape {list(getattr(value, 'shape', []))} that is no parameter, "
                            "buffer or batch input (a plain tensor attribute, a torch.tensor literal); register it "
                            "as a buffer of the model")
        dtype = _dtype_name(value.dtype)
        number = value.item()
        literal = ({"bool": bool(number)} if value.dtype == torch.bool else
                   {"float": _float(number)} if value.dtype.is_floating_point else {"int": int(number)})
        self.types[node.name] = (dtype, [])
        self.emit("aten::scalar_tensor", "", [literal, {"dtype": dtype}, {"none": None}, {"none": None},
                                              {"none": None}], [node.name], node)
        self.define(node, node.name, (dtype, []))

    def scalar_overload(self, node, schema):
        """op.Tensor called with a Python number as its second operand ->
        op.Scalar, which ATen computes the same way (a wrapped number)."""
        if len(node.args) < 2 or not isinstance(node.args[1], (int, float)) or isinstance(node.args[1], bool):
            return None
        if len(schema.arguments) < 2 or str(schema.arguments[1].type) != "Tensor":
            return None
        packet = getattr(torch.ops.aten, schema.name.split("::")[1], None)
        for candidate in ("Scalar", "Tensor_Scalar"):
            if packet is not None and candidate in packet.overloads():
                other = getattr(packet, candidate)._schema
                if [a.name for a in other.arguments] == [a.name for a in schema.arguments]:
                    return candidate, other
        return None

    def args(self, node, schema):
        out = []
        for i, formal in enumerate(schema.arguments):
            if i < len(node.args) and not formal.kwarg_only:
                value = node.args[i]
            elif formal.name in node.kwargs:
                value = node.kwargs[formal.name]
            else:
                value = formal.default_value
            out.append(self.arg(value, str(formal.type), node))
        return out

    # ---- nodes ------------------------------------------------------------------

    def emit(self, op, overload, args, outputs, node):
        self.nodes.append({"op": op + (f".{overload}" if overload else ""), "args": args,
                           "outputs": [None if o is None else {"name": o, "dtype": self.types[o][0],
                                                               "shape": self.types[o][1]} for o in outputs]})

    def typed_results(self, node):
        """Result names of `node` (None for results nothing reads or that the
        op leaves undefined), with their types recorded."""
        metas = _tensor_metas(node)
        names = self.result_names(node, len(metas))
        names = [n if m is not None else None for n, m in zip(names, metas)]
        for n, m in zip(names, metas):
            if n is not None:
                self.types[n] = m
        return names

    def result_names(self, node, count):
        """Names for a node's results: its own for a single tensor, else its
        getitem users' names. A result nothing reads gets none: the op may
        leave it undefined (an RNN backward's gradient of a zero initial
        state)."""
        if not _has_items(node):
            return [node.name]
        names = [None] * count
        for user in node.users:
            if user.target is operator.getitem and user.users:
                names[user.args[1]] = user.name
        return names

    def call(self, node):
        target = node.target
        if target is operator.getitem:
            return  # defined with its source node
        if not isinstance(target, torch._ops.OpOverload):
            self.fail(node, f"{target} is not an ATen operator (was the step traced with make_fx?)")
        schema = target._schema
        op, overload = schema.name, schema.overload_name
        overload = "" if overload == "default" else overload
        writes = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        if op in _BATCH_NORMS:
            return self.batch_norm(node, schema, op, overload)
        if writes:
            if writes != [0] or not op.endswith("_"):
                self.fail(node, f"{op} writes to its arguments in a way spmd cannot make functional")
            return self.in_place(node, schema, op, overload)
        scalar = self.scalar_overload(node, schema)
        if scalar:
            overload, schema = scalar
        names = self.typed_results(node)
        args = self.args(node, schema)
        self.emit(op, overload, args, names, node)
        self.bind_results(node, names)
        if (op in _VIEW_OPS or _views.is_view(schema)) and isinstance(node.args[0], torch.fx.Node):
            self.record_view(node, op, overload, args)

    def record_view(self, node, op, overload, args):
        """Notes `node` (and its getitem results) as views of its first argument."""
        source = self.tensor_of(node.args[0])
        base = self.root.get(source, source)
        views = [(node, None)] + [(u, u.args[1]) for u in node.users if u.target is operator.getitem]
        for view, index in views:
            self.root[view] = base
            self.view_of[view] = (source, op, overload, args, index)

    def bind_results(self, node, names):
        if not _has_items(node):
            if names[0] is None:
                self.fail(node, f"{node.target} produced no tensor metadata (meta: {list(node.meta)})")
            self.define(node, names[0], self.types[names[0]])
            return
        for user in node.users:
            if user.target is operator.getitem and names[user.args[1]] is not None:
                self.define(user, names[user.args[1]], self.types[names[user.args[1]]])

    def in_place(self, node, schema, op, overload):
        target = self.tensor_of(node.args[0])
        chain = self.view_chain(target)
        if chain[-1].op == "get_attr":  # a constant: the write would be lost
            self.fail(node, f"writes in place to {chain[-1].name}, a tensor that is no parameter, buffer or batch "
                            "input; register it as a buffer of the model")
        self.reject_observed_alias(node, target, chain)
        name = node.name
        self.types[name] = _tensor_metas(node)[0]
        if op == "aten::copy_":
            args = self.args(node, schema)
            src = args[1]["value"]
            if self.types[src] != self.types[name]:
                self.fail(node, "copy_ between tensors of different dtype or shape is not supported")
            name = src
        elif op == "aten::zero_":
            self.emit("aten::zeros_like", "", [self.args(node, schema)[0]] + [{"none": None}] * 5, [name], node)
        elif op == "aten::fill_" and overload == "Scalar":
            args = self.args(node, schema)
            self.emit("aten::full_like", "", [args[0], args[1]] + [{"none": None}] * 5, [name], node)
        else:
            base_op = op[:-1]
            overload = _out_of_place(base_op, schema, overload)
            if overload is None:
                self.fail(node, f"in-place {op} has no out-of-place form")
            functional = getattr(getattr(torch.ops.aten, base_op.split("::")[1]), overload or "default")._schema
            scalar = self.scalar_overload(node, functional)
            if scalar:
                overload, functional = scalar
            self.emit(base_op, overload, self.args(node, functional), [name], node)
        # The op's result is the updated tensor itself: both fx nodes read the new value.
        self.original.setdefault(node, name)
        self.same[node] = target
        self.current[target] = name
        self.write_back(node, target, name)

    def view_chain(self, tensor):
        """[tensor, the tensor it views, ..., the base that views nothing]."""
        chain = [tensor]
        while chain[-1] in self.view_of:
            chain.append(self.view_of[chain[-1]][0])
        return chain

    def write_back(self, node, view, value):
        """After `node` wrote `value` to `view`: the new value of each base
        up the view chain, by the inverse of the view op (_views.inverse)."""
        what = node.target._schema.name
        while view in self.view_of:
            source, op, overload, args, index = self.view_of[view]
            if op == "aten::as_strided" and source in self.view_of:
                self.fail(node, f"in-place {what} writes through an as_strided view of {source.name}, itself a "
                                "view, whose strides spmd_export cannot relate to it")
            base = self.current[source]
            try:
                spec = _views.inverse(op, overload, args, index, base, self.types[base], value, self.types[value])
            except _views.NotInvertible as e:
                self.fail(node, f"in-place {what} writes through a view made by {op}, {e}")
            if spec is not None:
                new = f"{node.name}_{source.name}_updated"
                self.types[new] = self.types[base]
                self.emit(spec[0], spec[1], spec[2], [new], node)
                value = new
            self.current[source] = value
            view = source

    def reject_observed_alias(self, node, target, chain):
        """An in-place write is only functional if no alias of the written
        storage that is read afterwards would observe it, other than the
        written tensor and the bases it views, which write_back updates."""
        base = chain[-1]
        for other, root in list(self.root.items()) + [(base, base)]:
            if root is not base or self.tensor_of(other) in chain:
                continue
            if any(self.order[u] > self.order[node] for u in other.users):
                self.fail(node, f"in-place {node.target._schema.name} writes to {target.name}, and {other.name}, "
                                f"a view of {base.name} taken before the write, is read after it (it would see the "
                                "write); take the view after the write")

    def batch_norm(self, node, schema, op, overload):
        """Training-mode BatchNorm writes its running statistics in place;
        spmd::batch_norm_train returns them instead."""
        args = self.args(node, schema)
        training = args[5].get("bool", False)
        has_stats = "value" in args[3] and "value" in args[4]
        names = self.typed_results(node)
        if not (training and has_stats):
            self.emit(op, overload, args, names, node)
            self.bind_results(node, names)
            return
        new_mean, new_var = node.name + "_running_mean", node.name + "_running_var"
        self.types[new_mean] = self.types[args[3]["value"]]
        self.types[new_var] = self.types[args[4]["value"]]
        self.emit("spmd::batch_norm_train", "", args[0:5] + args[6:8], names + [new_mean, new_var], node)
        self.bind_results(node, names)
        self.current[node.args[3]] = new_mean
        self.current[node.args[4]] = new_var


def _marked_tensor(marker, markers):
    """The fx node of the gradient a marker detach marks. Tensor.detach() may
    trace as two detach calls; those that only feed markers are stepped over,
    back to the value the optimizer itself reads."""
    detach = torch.ops.aten.detach.default

    def feeds_only_markers(node):
        return all(u in markers or (u.target is detach and feeds_only_markers(u)) for u in node.users)

    node = marker.args[0]
    while node.target is detach and isinstance(node.args[0], torch.fx.Node) and feeds_only_markers(node):
        node = node.args[0]
    return node


def _eliminate_dead(nodes, roots):
    live = set(roots)
    kept = []
    for n in reversed(nodes):
        outs = [o["name"] for o in n["outputs"] if o is not None]
        if not any(o in live for o in outs):
            continue
        kept.append(n)
        for a in n["args"]:
            live.update([a["value"]] if "value" in a else a.get("values", []))
    return list(reversed(kept))


def convert(gm, inputs, grad_params, error):
    """The dump of `gm`, whose placeholders are `inputs` [(name, kind, requires_grad)]
    in order and whose output is [loss, gradient of each of grad_params...].
    Expands `gm`'s foreach ops in place."""
    c = _Converter(expand_foreach(_drop_profiler_ranges(gm), error), error)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise error(f"internal: {len(placeholders)} placeholders for {len(inputs)} inputs")
    doc_inputs = []
    for node, (name, kind, requires_grad) in zip(placeholders, inputs):
        dtype, shape = _tensor_metas(node)[0]
        c.define(node, name, (dtype, shape))
        entry = {"name": name, "dtype": dtype, "shape": shape, "kind": kind}
        if kind == "parameter":
            entry["requires_grad"] = bool(requires_grad)
        doc_inputs.append(entry)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0]
    markers = set(results[1:])  # detach marks of each gradient as optimizer.step() read it
    grad_value = {}
    for node in gm.graph.nodes:
        if node in markers:
            grad_value[node] = c.ref(_marked_tensor(node, markers), node)
        elif node.op == "call_function":
            c.call(node)
        elif node.op == "get_attr":
            c.constant(node)
        elif node.op not in ("placeholder", "output"):
            c.fail(node, f"unsupported FX node kind {node.op}")
    loss = c.ref(results[0], output)
    gradients = [{"parameter": p, "value": grad_value[g]} for p, g in zip(grad_params, results[1:])]
    updates = [{"input": name, "value": c.current[node]}
               for node, (name, _, _) in zip(placeholders, inputs) if c.current[node] != name]
    roots = [loss] + [u["value"] for u in updates] + [g["value"] for g in gradients]
    return {"format": "spmd-graph", "version": 1, "inputs": doc_inputs,
            "nodes": _eliminate_dead(c.nodes, roots), "outputs": [loss], "updates": updates,
            "gradients": gradients}
