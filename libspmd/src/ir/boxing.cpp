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

namespace {

bool takesOptionalTensors(const c10::FunctionSchema& schema, size_t i) {
  if (i >= schema.arguments().size()) return false;
  auto list = schema.arguments()[i].real_type()->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::OptionalType;
}

}  // namespace

std::vector<c10::IValue> boxArguments(const Node& node, const c10::FunctionSchema& schema,
                                      const std::function<at::Tensor(ValueId)>& tensorOf) {
  std::vector<c10::IValue> stack;
  stack.reserve(node.args.size());
  for (size_t i = 0; i < node.args.size(); ++i) {
    const Arg& a = node.args[i];
    if (a.kind == Arg::Kind::Value) {
      stack.emplace_back(tensorOf(a.value));
    } else if (a.kind == Arg::Kind::Values && takesOptionalTensors(schema, i)) {
      c10::List<c10::optional<at::Tensor>> list;
      for (ValueId v : a.values) {
        list.push_back(v == kNoValue ? c10::optional<at::Tensor>() : c10::optional<at::Tensor>(tensorOf(v)));
      }
      stack.emplace_back(list);
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

namespace {

Arg listArg(Arg::Kind kind) {
  Arg a;
  a.kind = kind;
  return a;
}

Arg valuesFromList(const c10::IValue& v, const std::function<ValueId(const at::Tensor&)>& valueOf) {
  Arg a = listArg(Arg::Kind::Values);
  for (const c10::IValue& item : v.toListRef()) {
    a.values.push_back(item.isTensor() && item.toTensor().defined() ? valueOf(item.toTensor()) : kNoValue);
  }
  return a;
}

}  // namespace

Arg argFromIValue(const c10::Argument& formal, const c10::IValue& v,
                  const std::function<ValueId(const at::Tensor&)>& valueOf) {
  c10::TypePtr type = formal.real_type();
  if (auto opt = type->cast<c10::OptionalType>()) {
    if (v.isNone()) return Arg::none();
    type = opt->getElementType();
  }
  Arg a;
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return v.isTensor() && v.toTensor().defined() ? Arg::tensor(valueOf(v.toTensor())) : Arg::none();
    case c10::TypeKind::ScalarTypeType: a.kind = Arg::Kind::DType; a.i = v.toInt(); return a;
    case c10::TypeKind::LayoutType: a.kind = Arg::Kind::Layout; a.i = v.toInt(); return a;
    case c10::TypeKind::MemoryFormatType: a.kind = Arg::Kind::MemoryFormat; a.i = v.toInt(); return a;
    case c10::TypeKind::DeviceObjType:
      a.kind = Arg::Kind::Device;
      a.s = v.toDevice().is_meta() ? "cpu" : v.toDevice().str();
      return a;
    case c10::TypeKind::StringType: a.kind = Arg::Kind::Str; a.s = v.toStringRef(); return a;
    case c10::TypeKind::ListType: {
      if (v.isTensorList() || (v.isList() && type->containedType(0)->kind() == c10::TypeKind::OptionalType)) {
        return valuesFromList(v, valueOf);
      }
      if (v.isIntList()) { a = listArg(Arg::Kind::Ints); a.ints = v.toIntVector(); return a; }
      if (v.isDoubleList()) { a = listArg(Arg::Kind::Floats); a.floats = v.toDoubleVector(); return a; }
      if (v.isBoolList()) {
        a = listArg(Arg::Kind::Bools);
        for (bool b : v.toBoolList()) a.bools.push_back(b);
        return a;
      }
      break;
    }
    default: break;
  }
  if (v.isNone()) return Arg::none();
  if (v.isBool()) return Arg::ofBool(v.toBool());
  if (v.isInt()) return Arg::ofInt(v.toInt());
  if (v.isDouble()) return Arg::ofFloat(v.toDouble());
  throw std::invalid_argument("argument '" + formal.name() + "' holds a " + v.tagKind() + ", which a graph cannot hold");
}

at::Tensor metaTensorOf(const Value& v) { return metaTensor(v.dtype, v.shape); }

std::vector<at::Tensor> inferNodeOnMeta(const Node& node, const c10::OperatorHandle& op,
                                        const std::function<at::Tensor(ValueId)>& metaOf) {
  return inferOnMeta(op, boxArguments(node, op.schema(), metaOf));
}

}  // namespace spmd
