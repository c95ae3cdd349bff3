#include "spmd/ops/dispatch.h"

#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>

namespace spmd {

std::optional<c10::OperatorHandle> findOperator(const std::string& op, const std::string& overload) {
  ensureSpmdOpsRegistered();
  auto handle = c10::Dispatcher::singleton().findSchema({op, overload});
  if (!handle) return std::nullopt;
  return *handle;
}

namespace {

bool sameArguments(const c10::FunctionSchema& a, const c10::FunctionSchema& b) {
  if (a.arguments().size() != b.arguments().size()) return false;
  for (size_t i = 0; i < a.arguments().size(); ++i) {
    if (*a.arguments()[i].real_type() != *b.arguments()[i].real_type()) return false;
  }
  return true;
}

}  // namespace

std::optional<std::pair<std::string, std::string>> outOfPlaceOverload(const c10::FunctionSchema& inPlace) {
  const std::string& name = inPlace.name();
  if (name.empty() || name.back() != '_') return std::nullopt;
  const std::string base = name.substr(0, name.size() - 1);
  // The same overload name first: it is the usual pairing (add_.Tensor, add.Tensor).
  auto same = c10::Dispatcher::singleton().findSchema({base, inPlace.overload_name()});
  if (same && !same->schema().is_mutable() && sameArguments(same->schema(), inPlace)) {
    return std::make_pair(base, inPlace.overload_name());
  }
  for (const c10::OperatorName& candidate : c10::Dispatcher::singleton().getAllOpNames()) {
    if (candidate.name != base) continue;
    auto op = c10::Dispatcher::singleton().findSchema(candidate);
    if (op && !op->schema().is_mutable() && sameArguments(op->schema(), inPlace)) {
      return std::make_pair(candidate.name, candidate.overload_name);
    }
  }
  return std::nullopt;
}

std::vector<at::Tensor> callOperator(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
  op.callBoxed(&stack);
  std::vector<at::Tensor> results;
  results.reserve(stack.size());
  for (auto& v : stack) {
    if (v.isTensor()) {
      results.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) results.push_back(t);
    } else {
      throw std::runtime_error(op.schema().name() + " returned a non-tensor value");
    }
  }
  return results;
}

std::string qualifiedOpName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::vector<c10::IValue> callByArgumentName(const std::string& name, const std::map<std::string, c10::IValue>& named) {
  const size_t dot = name.find('.', name.find("::"));
  const auto op = dot == std::string::npos ? c10::Dispatcher::singleton().findSchema({name, ""})
                                           : c10::Dispatcher::singleton().findSchema({name.substr(0, dot), name.substr(dot + 1)});
  TORCH_CHECK(op.has_value(), "this LibTorch has no ", name);
  torch::jit::Stack stack;
  for (const c10::Argument& a : op->schema().arguments()) {
    auto it = named.find(a.name());
    if (it != named.end()) {
      stack.push_back(it->second);
    } else {
      TORCH_CHECK(a.default_value().has_value(), "no value for ", name, "'s argument ", a.name());
      stack.push_back(*a.default_value());
    }
  }
  op->callBoxed(&stack);
  return stack;
}

c10::IValue mapTensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorVector()) list.push_back(f(t));
    return list;
  }
  if (v.isList() && v.type()->containedType(0)->kind() == c10::TypeKind::OptionalType) {  // Tensor?[]
    c10::List<c10::optional<at::Tensor>> list;
    for (const c10::IValue& item : v.toListRef()) {
      list.push_back(item.isNone() ? c10::optional<at::Tensor>() : c10::optional<at::Tensor>(f(item.toTensor())));
    }
    return list;
  }
  return v;
}

}  // namespace spmd
