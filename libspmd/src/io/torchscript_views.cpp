// Writes through views made functional: the base's new value from a view's
// new value, by each view op's inverse (a reshape back, a transpose back,
// select_scatter, slice_scatter, ...), as LibTorch's functionalization
// computes it.
#include "torchscript_internal.h"

#include "spmd/ir/builder.h"

namespace spmd {
namespace torchscript_detail {

// The base's new value from a view's new value.
ValueId viewInverse(Graph& graph, const std::string& source, const std::string& where, const ViewTable::View& view,
                    ValueId base, ValueId updated) {
  GraphBuilder b(graph);
  b.setMeta(NodeMeta{source});
  const Node& v = view.node;
  const std::string op = v.op;
  const auto baseShape = graph.value(base).shape;
  auto intAt = [&](size_t i) { return v.args.at(i).i; };
  if (op == "aten::view" || op == "aten::reshape" || op == "aten::flatten" || op == "aten::unflatten" ||
      op == "aten::squeeze" || op == "aten::unsqueeze" || op == "aten::view_as" || op == "aten::_unsafe_view") {
    return b.reshape(updated, baseShape);
  }
  if (op == "aten::detach" || op == "aten::alias") return updated;
  if (op == "aten::t") return b.call("aten::t", {Arg::tensor(updated)});
  if (op == "aten::transpose") return b.transpose(updated, intAt(1), intAt(2));
  if (op == "aten::permute") {
    std::vector<int64_t> dims = v.args.at(1).ints, inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
      const int64_t d = dims[i] < 0 ? dims[i] + static_cast<int64_t>(dims.size()) : dims[i];
      inverse.at(static_cast<size_t>(d)) = static_cast<int64_t>(i);
    }
    return b.call("aten::permute", {Arg::tensor(updated), intsArg(inverse)});
  }
  if (op == "aten::select") {
    return b.call("aten::select_scatter", {Arg::tensor(base), Arg::tensor(updated), v.args[1], v.args[2]});
  }
  if (op == "aten::slice") {
    return b.call("aten::slice_scatter", {Arg::tensor(base), Arg::tensor(updated), v.args[1], v.args[2], v.args[3], v.args[4]});
  }
  if (op == "aten::narrow") {
    const int64_t start = intAt(2);
    return b.call("aten::slice_scatter", {Arg::tensor(base), Arg::tensor(updated), v.args[1], Arg::ofInt(start),
                                          Arg::ofInt(start + intAt(3)), Arg::ofInt(1)});
  }
  if (op == "aten::diagonal") {
    return b.call("aten::diagonal_scatter", {Arg::tensor(base), Arg::tensor(updated), v.args[1], v.args[2], v.args[3]});
  }
  if (op == "aten::unbind") {
    return b.call("aten::select_scatter", {Arg::tensor(base), Arg::tensor(updated), v.args[1], Arg::ofInt(static_cast<int64_t>(view.index))});
  }
  if (op == "aten::split" || op == "aten::chunk") {  // (self, split_size | chunks, dim)
    int64_t dim = intAt(2);
    if (dim < 0) dim += static_cast<int64_t>(baseShape.size());
    int64_t start = 0;
    for (size_t k = 0; k < view.index; ++k) start += graph.value(v.outputs[k]).shape.at(static_cast<size_t>(dim));
    const int64_t length = graph.value(v.outputs[view.index]).shape.at(static_cast<size_t>(dim));
    return b.call("aten::slice_scatter", {Arg::tensor(base), Arg::tensor(updated), Arg::ofInt(dim), Arg::ofInt(start),
                                          Arg::ofInt(start + length), Arg::ofInt(1)});
  }
  throw Diagnostic(where, "an in-place operation writes to a view made by " + op +
                             ", which the functional graph cannot express");
}

}  // namespace torchscript_detail
}  // namespace spmd
