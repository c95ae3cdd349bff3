#include "spmd/ir/builder.h"

#include "spmd/ir/boxing.h"
#include "spmd/ops/dispatch.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace spmd {

Arg intsArg(std::vector<int64_t> v) {
  Arg a;
  a.kind = Arg::Kind::Ints;
  a.ints = std::move(v);
  return a;
}

Arg boolsArg(std::vector<bool> v) {
  Arg a;
  a.kind = Arg::Kind::Bools;
  a.bools = std::move(v);
  return a;
}

Arg strArg(std::string s) {
  Arg a;
  a.kind = Arg::Kind::Str;
  a.s = std::move(s);
  return a;
}

Arg dtypeArg(c10::ScalarType t) {
  Arg a;
  a.kind = Arg::Kind::DType;
  a.i = static_cast<int64_t>(t);
  return a;
}

at::Tensor GraphBuilder::metaOf(ValueId v) {
  auto it = metaCache_.find(v);
  if (it != metaCache_.end()) return it->second;
  return metaTensorOf(graph_.value(v));
}

void GraphBuilder::setInsertionPointAfter(const Node& node) {
  const size_t next = graph_.indexOf(node) + 1;
  insertBefore_ = next < graph_.nodes().size() ? &graph_.nodes()[next] : nullptr;
}

Node GraphBuilder::typedNode(const std::string& op, std::vector<Arg> args, const std::string& base,
                             const std::vector<ValueId>& preset) {
  Node node;
  size_t sep = op.find("::");
  size_t dot = op.find('.', sep);
  node.op = op.substr(0, dot);
  node.overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  node.args = std::move(args);
  node.meta = meta_;
  auto handle = findOperator(node);
  if (!handle) throw std::logic_error("GraphBuilder: unknown operator " + op);
  std::vector<at::Tensor> results;
  try {
    results = inferNodeOnMeta(node, *handle, [&](ValueId v) { return metaOf(v); });
  } catch (const Diagnostic& d) {
    throw Diagnostic(meta_.source, d.message());  // the input's shapes are beyond a bound: no internal error
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw std::logic_error("GraphBuilder: " + op + " rejected its arguments: " + what.substr(0, what.find('\n')));
  }
  std::string name = base.empty() ? node.op.substr(sep + 2) : base;
  for (size_t k = 0; k < results.size(); ++k) {
    const at::Tensor& r = results[k];
    if (k < preset.size() && preset[k] != kNoValue) {
      const Value& kept = graph_.value(preset[k]);
      if (!r.defined() || r.sizes() != c10::IntArrayRef(kept.shape) || r.scalar_type() != kept.dtype) {
        throw std::logic_error("GraphBuilder: " + op + " result " + std::to_string(k) + " does not match '" + kept.name + "'");
      }
      metaCache_[preset[k]] = r;
      node.outputs.push_back(preset[k]);
      continue;
    }
    if (!r.defined()) {
      node.outputs.push_back(kNoValue);
      continue;
    }
    ValueId id = graph_.addValue(Value{graph_.freshName(name), r.scalar_type(), r.sizes().vec()});
    metaCache_[id] = r;
    node.outputs.push_back(id);
  }
  return node;
}

std::vector<ValueId> GraphBuilder::callMulti(const std::string& op, std::vector<Arg> args, const std::string& base,
                                             const std::vector<ValueId>& preset) {
  Node node = typedNode(op, std::move(args), base, preset);
  std::vector<ValueId> outputs = node.outputs;
  if (insertBefore_) {
    graph_.insertBefore(*insertBefore_, std::move(node));
  } else {
    graph_.addNode(std::move(node));
  }
  return outputs;
}

void GraphBuilder::replace(const Node& old, const std::string& op, std::vector<Arg> args) {
  const std::vector<ValueId> outputs = old.outputs;
  replace(old, op, std::move(args), outputs);
}

void GraphBuilder::replace(const Node& old, const std::string& op, std::vector<Arg> args,
                           const std::vector<ValueId>& outputs) {
  graph_.replaceNode(old, typedNode(op, std::move(args), "", outputs));
}

ValueId GraphBuilder::call(const std::string& op, std::vector<Arg> args, const std::string& base) {
  auto outputs = callMulti(op, std::move(args), base);
  if (outputs.size() != 1 || outputs[0] == kNoValue) {
    throw std::logic_error("GraphBuilder: " + op + " does not return one tensor");
  }
  return outputs[0];
}

ValueId GraphBuilder::add(ValueId a, ValueId b, double alpha) {
  Arg scale = alpha == 1.0 ? Arg::ofInt(1) : Arg::ofFloat(alpha);
  return call("aten::add.Tensor", {Arg::tensor(a), Arg::tensor(b), scale});
}

ValueId GraphBuilder::mul(ValueId a, ValueId b) { return call("aten::mul.Tensor", {Arg::tensor(a), Arg::tensor(b)}); }

ValueId GraphBuilder::mulScalar(ValueId a, double s) {
  return call("aten::mul.Scalar", {Arg::tensor(a), Arg::ofFloat(s)});
}

ValueId GraphBuilder::neg(ValueId a) { return call("aten::neg", {Arg::tensor(a)}); }

ValueId GraphBuilder::reshape(ValueId a, const std::vector<int64_t>& shape) {
  if (graph_.value(a).shape == shape) return a;
  return call("aten::reshape", {Arg::tensor(a), intsArg(shape)});
}

ValueId GraphBuilder::transpose(ValueId a, int64_t d0, int64_t d1) {
  return call("aten::transpose.int", {Arg::tensor(a), Arg::ofInt(d0), Arg::ofInt(d1)});
}

ValueId GraphBuilder::sumTo(ValueId a, const std::vector<int64_t>& shape) {
  if (graph_.value(a).shape == shape) return a;
  return call("aten::sum_to_size", {Arg::tensor(a), intsArg(shape)});
}

ValueId GraphBuilder::cast(ValueId a, c10::ScalarType dtype, const std::string& base) {
  return call("aten::_to_copy",
              {Arg::tensor(a), dtypeArg(dtype), Arg::none(), Arg::none(), Arg::none(), Arg::ofBool(false), Arg::none()},
              base);
}

ValueId GraphBuilder::zerosLike(ValueId a) {
  return call("aten::zeros_like", {Arg::tensor(a), Arg::none(), Arg::none(), Arg::none(), Arg::none(), Arg::none()});
}

}  // namespace spmd
