#include "spmd/ir/boxing.h"

#include "spmd/ops/dispatch.h"
#include "spmd/ops/meta.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace spmd {

std::optional<c10::OperatorHandle> findOperator(const Node& node) { return findOperator(node.op, node.overload); }

namespace {

c10::IValue boxConstant(const Arg& a) {
  switch (a.kind) {
    case Arg::Kind::None: return c10::IValue();
    case Arg::Kind::Int:
    case Arg::Kind::DType:
    case Arg::Kind::Layout:
    case Arg::Kind::MemoryFormat: return c10::IValue(a.i);
    case Arg::Kind::Float: return c10::IValue(a.f);
    case Arg::Kind::Bool: return c10::IValue(a.b);
    case Arg::Kind::Str: return c10::IValue(a.s);
    case Arg::Kind::Ints: return c10::IValue(a.ints);
    case Arg::Kind::Floats: return c10::IValue(a.floats);
    case Arg::Kind::Bools: {
      c10::List<bool> list;
      for (bool b : a.bools) list.push_back(b);
      return c10::IValue(list);
    }
    case Arg::Kind::Device: return c10::IValue(c10::Device(a.s));
    case Arg::Kind::Value:
    case Arg::Kind::Values: break;
  }
  throw std::logic_error("boxConstant called on a tensor argument");
}

}  // namespace

std::vector<c10::IValue> boxArguments(const Node& node, const std::function<at::Tensor(ValueId)>& tensorOf) {
  std::vector<c10::IValue> stack;
  stack.reserve(node.args.size());
  for (const Arg& a : node.args) {
    if (a.kind == Arg::Kind::Value) {
      stack.emplace_back(tensorOf(a.value));
    } else if (a.kind == Arg::Kind::Values) {
      std::vector<at::Tensor> list;
      for (ValueId v : a.values) list.push_back(tensorOf(v));
      stack.emplace_back(c10::List<at::Tensor>(list));
    } else {
      stack.push_back(boxConstant(a));
    }
  }
  return stack;
}

at::Tensor metaTensorOf(const Value& v) { return metaTensor(v.dtype, v.shape); }

std::vector<at::Tensor> inferNodeOnMeta(const Node& node, const c10::OperatorHandle& op,
                                        const std::function<at::Tensor(ValueId)>& metaOf) {
  return inferOnMeta(op, boxArguments(node, metaOf));
}

}  // namespace spmd
