"""Writes through views, made functional: the new value of a view's base
from the new value of the view.

make_fx records the writes that the step (or autograd's own backward, which
fills a fresh zero buffer through an as_strided view, say) makes through
views: `buffer.new_zeros(...)[2:4].copy_(x)`, then reads of `buffer`. In the
dump every value is immutable, so the base's new value is computed from the
view's by the view op's inverse: a scatter into the old base for views that
pick elements (slice_scatter for slice, select_scatter for select, ...), the
inverse reshape or permutation for views that rearrange all of them. These
are the inverses LibTorch's functionalization uses, and the ones spmd's
TorchScript importer uses (libspmd/src/io/torchscript_views.cpp).
"""

# Views that keep every element in order (a reshape of it): the base is the
# view's new value reshaped back.
_RESHAPES = {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::view_as",
             "aten::squeeze", "aten::unsqueeze", "aten::flatten", "aten::unflatten"}
# Views that are the base itself.
_IDENTITIES = {"aten::detach", "aten::alias", "aten::contiguous", "aten::lift_fresh"}


class NotInvertible(Exception):
    """A view whose writes have no functional form here (the reason)."""


def is_view(schema):
    """Whether an op's result may alias its first argument (its schema says
    so: `Tensor(a) self -> Tensor(a)`), without writing to it."""
    if not schema.returns or schema.returns[0].alias_info is None:
        return False
    return not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _int(arg):
    return arg["int"]


def inverse(view_op, overload, args, index, base, base_type, update, update_type):
    """(op, overload, args) of the node whose result is the new value of the
    base `base` (of type base_type) once the view `view_op.overload(args)`,
    result `index` of a multi-result view (split, unbind) or None, is
    `update`; None where the view is the base itself. Raises NotInvertible."""
    if base_type[0] != update_type[0]:
        raise NotInvertible(f"which reinterprets {base_type[0]} as {update_type[0]}")
    b, u = {"value": base}, {"value": update}
    if view_op in _IDENTITIES:
        return None
    if view_op in _RESHAPES:
        return "aten::reshape", "", [u, {"ints": list(base_type[1])}]
    if view_op == "aten::t":
        return "aten::t", "", [u]
    if view_op == "aten::transpose":
        return "aten::transpose", "int", [u, args[1], args[2]]
    if view_op == "aten::permute":
        dims = [d % len(base_type[1]) for d in args[1]["ints"]]
        return "aten::permute", "", [u, {"ints": [dims.index(i) for i in range(len(dims))]}]
    if view_op == "aten::select":
        return "aten::select_scatter", "", [b, u, args[1], args[2]]
    if view_op == "aten::slice":
        return "aten::slice_scatter", "", [b, u] + args[1:5]
    if view_op == "aten::diagonal":
        return "aten::diagonal_scatter", "", [b, u] + args[1:4]
    if view_op == "aten::as_strided":
        return "aten::as_strided_scatter", "", [b, u] + args[1:4]
    if view_op == "aten::unbind":
        return "aten::select_scatter", "", [b, u, args[1], {"int": index}]
    if view_op in ("aten::split", "aten::split_with_sizes"):
        return "aten::slice_scatter", "", [b, u] + _split_range(view_op, args, index, update_type)
    raise NotInvertible("whose inverse spmd_export does not know")


def _split_range(view_op, args, index, update_type):
    """[dim, start, end, step] of result `index` of split(self, size, dim)
    or split_with_sizes(self, sizes, dim)."""
    dim = _int(args[2])
    if view_op == "aten::split":
        start = index * _int(args[1])
    else:
        start = sum(args[1]["ints"][:index])
    length = update_type[1][dim]
    return [{"int": dim}, {"int": start}, {"int": start + length}, {"int": 1}]
