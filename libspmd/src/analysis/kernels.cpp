#include "spmd/analysis/kernels.h"

#include "spmd/ops/attention_codegen.h"
#include "spmd/ops/column_sum_codegen.h"
#include "spmd/ops/cross_entropy_codegen.h"
#include "spmd/ops/cuda_codegen.h"
#include "spmd/ir/verify.h"
#include "spmd/ops/dtype.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/ops/kernel_spec.h"
#include "spmd/ops/layer_norm_codegen.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace spmd {
namespace {

// The ops whose kernels spmd generates (ir/op_name.h).
struct Ops {
  OpName column_sum = OpName::known("spmd::column_sum");
  OpName cross_entropy = OpName::known("spmd::cross_entropy");
  OpName cross_entropy_backward = OpName::known("spmd::cross_entropy_backward");
  OpName cross_entropy_with_grad = OpName::known("spmd::cross_entropy_with_grad");
  OpName cross_entropy_with_grad_upcast = OpName::known("spmd::cross_entropy_with_grad.upcast");
  OpName fused = OpName::known("spmd::fused");
  OpName fused_attention = OpName::known("spmd::fused_attention");
  OpName fused_attention_backward = OpName::known("spmd::fused_attention_backward");
  OpName layer_norm = OpName::known("spmd::layer_norm");
  OpName layer_norm_backward = OpName::known("spmd::layer_norm_backward");
};
const Ops& ops() { return opTable<Ops>(); }

std::string typed(const Graph& g, ValueId v) {
  const Value& value = g.value(v);
  std::string s = "%" + value.name + ": " + dtypeShortName(value.dtype) + "[";
  for (size_t d = 0; d < value.shape.size(); ++d) s += (d ? "," : "") + std::to_string(value.shape[d]);
  return s + "]";
}

// A node's arguments as a kernel spec reads them (ops/kernel_spec.h).
class NodeCallArgs final : public KernelCallArgs {
 public:
  NodeCallArgs(const Graph& g, const Node& n) : g_(g), n_(n) {}
  bool given(size_t arg) const override { return n_.args.at(arg).kind == Arg::Kind::Value; }
  c10::ScalarType dtype(size_t arg) const override { return g_.value(n_.args.at(arg).value).dtype; }
  std::vector<int64_t> shape(size_t arg) const override { return g_.value(n_.args.at(arg).value).shape; }
  double real(size_t arg) const override { return n_.args.at(arg).f; }
  int64_t integer(size_t arg) const override { return n_.args.at(arg).i; }
  bool flag(size_t arg) const override { return n_.args.at(arg).b; }

 private:
  const Graph& g_;
  const Node& n_;
};

// The program's operations in order, without operands: "add cast".
std::string opsOf(const PointwiseProgram& p) {
  std::string s;
  for (const auto& st : p.statements) s += std::string(s.empty() ? "" : " ") + pointwiseOpInfo(st.op).name;
  return s;
}

// The kernel signature spmd::fused's CUDA kernel will see for these inputs
// (fusedKernelLayout), from the verifier's meta tensors with their strides;
// contiguous inputs where a meta tensor is missing.
std::vector<KernelTensor> launchSignature(const Graph& g, const PointwiseProgram& program,
                                          const std::vector<ValueId>& inputs, const std::vector<at::Tensor>& metas) {
  std::vector<at::Tensor> given;
  for (ValueId v : inputs) {
    if (static_cast<size_t>(v) >= metas.size() || !metas[v].defined()) {
      std::vector<KernelTensor> sig;
      for (ValueId u : inputs) sig.push_back({g.value(u).dtype, g.value(u).shape});
      return sig;
    }
    given.push_back(metas[v]);
  }
  return fusedKernelLayout(program, given).signature;
}

FusedKernel pointwiseKernel(const Graph& g, size_t i, const std::vector<at::Tensor>& metas) {
  const Node& n = g.nodes()[i];
  const std::string where = "/nodes/" + std::to_string(i);
  if (n.args.size() != 2 || n.args[0].kind != Arg::Kind::Values || n.args[1].kind != Arg::Kind::Str) {
    throw Diagnostic(where, "spmd::fused takes a list of tensors and a program");
  }
  FusedKernel k;
  k.node = i;
  k.program = n.args[1].s;
  k.inputs = n.args[0].values;
  k.outputs = n.outputs;
  for (ValueId v : k.inputs) k.bytesRead += bytes(g.value(v));
  for (ValueId v : k.outputs) k.bytesWritten += bytes(g.value(v));
  try {
    const PointwiseKernelSpec spec(k.program, launchSignature(g, parsePointwiseProgram(k.program), k.inputs, metas));
    k.ops = opsOf(spec.program());
    k.key = spec.key();
    k.source = spec.source();
  } catch (const std::invalid_argument& e) {
    throw Diagnostic(where, std::string("spmd::fused: ") + e.what());
  } catch (const c10::Error& e) {
    throw Diagnostic(where, std::string("spmd::fused: ") + e.what_without_backtrace());
  }
  return k;
}

// The "gemm" kernel of spmd::fused_attention(_backward): the generated
// softmax over its probabilities (the forward's second result, the
// backward's seventh argument), in place; bytes as the kernels touch them
// (attentionSoftmaxElements: under a causal mask fewer than the matrix).
std::optional<FusedKernel> attentionSoftmaxKernel(const Graph& g, size_t i) {
  const Node& n = g.nodes()[i];
  const bool forward = n.is(ops().fused_attention);
  const size_t kernelArg = forward ? 7 : 12, scaleArg = forward ? 4 : 9, probsArg = 6;
  if ((!forward && !n.is(ops().fused_attention_backward)) || n.args.size() <= kernelArg ||
      n.args[kernelArg].kind != Arg::Kind::Str || n.args[kernelArg].s != "gemm") {
    return std::nullopt;
  }
  const ValueId probs = forward ? n.outputs.at(1) : n.args.at(probsArg).value;
  const Value& p = g.value(probs);
  FusedKernel k;
  k.node = i;
  k.ops = forward ? "attention-softmax" : "attention-softmax-backward";
  (forward ? k.outputs : k.inputs).push_back(probs);
  try {
    const bool causal = n.args.at(scaleArg + 1).b;
    const AttentionSoftmaxKernelSpec spec = AttentionSoftmaxKernelSpec::forScores(p.shape, n.args.at(scaleArg).f, causal);
    k.key = spec.key();
    k.source = spec.source();
    const int64_t queries = p.shape[p.shape.size() - 2], keys = p.shape.back();
    const AttentionSoftmaxElements e = attentionSoftmaxElements(queries, keys, causal);
    const int64_t perElement = queries * keys > 0 ? bytes(p) / (queries * keys) : 0;  // matrices x element size
    k.bytesRead = (forward ? 1 : 2) * e.read * perElement;
    k.bytesWritten = e.written * perElement;
  } catch (const std::invalid_argument& e) {
    throw Diagnostic("/nodes/" + std::to_string(i), n.op + ": " + e.what());
  }
  return k;
}

// spmd::cross_entropy_with_grad: reads the logits once, writes their gradient.
FusedKernel crossEntropyWithGradKernel(const Graph& g, size_t i) {
  const Node& n = g.nodes()[i];
  FusedKernel k;
  k.node = i;
  const bool upcast = n.is(ops().cross_entropy_with_grad_upcast);
  k.ops = upcast ? "cross-entropy-with-grad-upcast" : "cross-entropy-with-grad";
  try {
    const CrossEntropyWithGradKernelSpec spec = CrossEntropyWithGradKernelSpec::forCall(NodeCallArgs(g, n), upcast);
    k.inputs.push_back(n.args[0].value);
    k.outputs.push_back(n.outputs.at(2));
    k.bytesRead = k.bytesWritten = bytes(g.value(n.args[0].value));
    k.key = spec.key();
    k.source = spec.source();
  } catch (const std::exception& e) {
    throw Diagnostic("/nodes/" + std::to_string(i), n.op + ": " + e.what());
  }
  return k;
}

// spmd::cross_entropy(_backward): the forward reads the logits once, the
// backward reads them and writes their gradient.
std::optional<FusedKernel> crossEntropyKernel(const Graph& g, size_t i) {
  const Node& n = g.nodes()[i];
  const bool forward = n.is(ops().cross_entropy);
  if (n.is(ops().cross_entropy_with_grad) || n.is(ops().cross_entropy_with_grad_upcast)) {
    return crossEntropyWithGradKernel(g, i);
  }
  if (!forward && !n.is(ops().cross_entropy_backward)) return std::nullopt;
  const size_t logitsArg = forward ? 0 : 1;
  FusedKernel k;
  k.node = i;
  k.ops = forward ? "cross-entropy" : "cross-entropy-backward";
  try {
    const NodeCallArgs call(g, n);
    const CrossEntropyKernelSpec spec =
        forward ? CrossEntropyKernelSpec::forCall(call) : CrossEntropyKernelSpec::forBackwardCall(call);
    const Value& logits = g.value(n.args.at(logitsArg).value);
    k.inputs.push_back(n.args[logitsArg].value);
    if (!forward) k.outputs.push_back(n.outputs.at(0));
    k.bytesRead = bytes(logits);
    k.bytesWritten = forward ? 0 : bytes(logits);
    k.key = spec.key();
    k.source = spec.source();
  } catch (const std::exception& e) {
    throw Diagnostic("/nodes/" + std::to_string(i), n.op + ": " + e.what());
  }
  return k;
}

// spmd::layer_norm(_backward): each tensor argument read once and each
// result written once (the backward's partial sums, a few KB, not counted).
std::optional<FusedKernel> layerNormKernel(const Graph& g, size_t i) {
  const Node& n = g.nodes()[i];
  const bool forward = n.is(ops().layer_norm);
  if (!forward && !n.is(ops().layer_norm_backward)) return std::nullopt;
  FusedKernel k;
  k.node = i;
  k.ops = forward ? "layer-norm" : "layer-norm-backward";
  forEachTensorArg(n, [&](ValueId v) {
    k.inputs.push_back(v);
    k.bytesRead += bytes(g.value(v));
  });
  for (ValueId v : n.outputs) {
    if (v == kNoValue) continue;
    k.outputs.push_back(v);
    k.bytesWritten += bytes(g.value(v));
  }
  try {
    const NodeCallArgs call(g, n);
    if (forward) {
      const LayerNormKernelSpec spec = LayerNormKernelSpec::forCall(call);
      k.key = spec.key();
      k.source = spec.source();
    } else {
      const LayerNormBackwardKernelSpec spec = LayerNormBackwardKernelSpec::forCall(call);
      k.key = spec.key();
      k.source = spec.source();
    }
  } catch (const std::exception& e) {
    throw Diagnostic("/nodes/" + std::to_string(i), n.op + ": " + e.what());
  }
  return k;
}

// spmd::column_sum: reads its input once, writes one row.
std::optional<FusedKernel> columnSumKernel(const Graph& g, size_t i) {
  const Node& n = g.nodes()[i];
  if (!n.is(ops().column_sum)) return std::nullopt;
  FusedKernel k;
  k.node = i;
  k.ops = "column-sum";
  try {
    const ColumnSumKernelSpec spec = ColumnSumKernelSpec::forCall(NodeCallArgs(g, n));
    k.inputs.push_back(n.args[0].value);
    k.outputs.push_back(n.outputs.at(0));
    k.bytesRead = bytes(g.value(n.args[0].value));
    k.bytesWritten = bytes(g.value(n.outputs[0]));
    k.key = spec.key();
    k.source = spec.source();
  } catch (const std::exception& e) {
    throw Diagnostic("/nodes/" + std::to_string(i), n.op + ": " + e.what());
  }
  return k;
}

}  // namespace

std::vector<FusedKernel> fusedKernels(const Graph& g) {
  std::vector<FusedKernel> kernels;
  std::optional<std::vector<at::Tensor>> metas;  // the values' layouts, found at the first spmd::fused
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i].is(ops().fused)) {
      if (!metas) metas = metaValues(g);
      kernels.push_back(pointwiseKernel(g, i, *metas));
    } else if (auto k = attentionSoftmaxKernel(g, i)) {
      kernels.push_back(std::move(*k));
    } else if (auto ce = crossEntropyKernel(g, i)) {
      kernels.push_back(std::move(*ce));
    } else if (auto ln = layerNormKernel(g, i)) {
      kernels.push_back(std::move(*ln));
    } else if (auto cs = columnSumKernel(g, i)) {
      kernels.push_back(std::move(*cs));
    }
  }
  return kernels;
}

std::string printKernels(const Graph& g, const std::vector<FusedKernel>& kernels, bool sources) {
  std::ostringstream out;
  int64_t moved = 0;
  std::map<std::string, size_t> firstWithSource;
  for (size_t k = 0; k < kernels.size(); ++k) {
    const FusedKernel& kernel = kernels[k];
    const Node& n = g.nodes()[kernel.node];
    out << "kernel " << k << "  node " << kernel.node << (n.meta.source.empty() ? "" : "  " + n.meta.source)
        << "  ops: " << kernel.ops << "\n";
    for (ValueId v : kernel.inputs) out << "  in   " << typed(g, v) << "\n";
    for (ValueId v : kernel.outputs) out << "  out  " << typed(g, v) << "\n";
    out << "  bytes moved " << kernel.bytesRead + kernel.bytesWritten << " (read " << kernel.bytesRead << ", written "
        << kernel.bytesWritten << ")\n";
    if (sources) {
      // One source may serve several kernels (an attention's forward and
      // backward): equal keys, equal sources.
      auto [first, fresh] = firstWithSource.emplace(kernel.key, k);
      out << (fresh ? kernel.source : "  source: as kernel " + std::to_string(first->second) + "'s\n");
    }
    moved += kernel.bytesRead + kernel.bytesWritten;
  }
  out << kernels.size() << " generated kernel(s), " << moved << " bytes moved per step\n";
  return out.str();
}

std::string printKernelsJson(const Graph& g, const std::vector<FusedKernel>& kernels, bool sources) {
  nlohmann::json list = nlohmann::json::array();
  for (const FusedKernel& kernel : kernels) {
    nlohmann::json k{{"node", kernel.node},
                     {"ops", kernel.ops},
                     {"program", kernel.program},
                     {"bytes_read", kernel.bytesRead},
                     {"bytes_written", kernel.bytesWritten}};
    for (const char* key : {"inputs", "outputs"}) {
      nlohmann::json values = nlohmann::json::array();
      for (ValueId v : std::string(key) == "inputs" ? kernel.inputs : kernel.outputs) values.push_back(g.value(v).name);
      k[key] = values;
    }
    if (sources) k["source"] = kernel.source;
    list.push_back(k);
  }
  return list.dump(2) + "\n";
}

}  // namespace spmd
