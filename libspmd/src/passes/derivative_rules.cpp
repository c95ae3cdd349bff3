// The hand-written reverse-mode rules, one per differentiable op, and the
// table findDerivative looks them up in; decompositions.cpp holds the rewrites.
#include "spmd/passes/derivatives.h"

#include "derivatives_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>

namespace spmd {
namespace {

using derivatives_detail::boolAt;
using derivatives_detail::in;
using derivatives_detail::intAt;
using derivatives_detail::intsAt;
using derivatives_detail::isNone;
using derivatives_detail::mT;
using derivatives_detail::out;
using derivatives_detail::scalarAt;

int64_t normalizeDim(int64_t dim, size_t rank) { return dim < 0 ? dim + static_cast<int64_t>(rank) : dim; }

// A Scalar argument that keeps an integral value integral.
Arg scalarArg(double v) {
  if (v == static_cast<double>(static_cast<int64_t>(v)) && std::abs(v) < 1e15) return Arg::ofInt(static_cast<int64_t>(v));
  return Arg::ofFloat(v);
}

using Grads = std::vector<Contribution>;

// ---- linear algebra ----------------------------------------------------------

Grads linearRule(RuleInput& r) {
  const Node& n = r.node;
  ValueId g = r.grads[0];
  ValueId x = in(n, 0), w = in(n, 1);
  Grads grads;
  if (r.needsGrad(x)) grads.push_back({x, r.b.call("aten::matmul", {Arg::tensor(g), Arg::tensor(w)})});
  if (r.needsGrad(w)) {
    const int64_t outFeatures = r.b.shape(w)[0], inFeatures = r.b.shape(w)[1];
    ValueId g2 = r.b.reshape(g, {numel(r.b.value(g)) / outFeatures, outFeatures});
    ValueId x2 = r.b.reshape(x, {numel(r.b.value(x)) / inFeatures, inFeatures});
    ValueId gt = r.b.call("aten::t", {Arg::tensor(g2)});
    grads.push_back({w, r.b.call("aten::mm", {Arg::tensor(gt), Arg::tensor(x2)})});
  }
  if (!isNone(n, 2) && r.needsGrad(in(n, 2))) grads.push_back({in(n, 2), r.b.sumTo(g, r.b.shape(in(n, 2)))});
  return grads;
}

Grads mmRule(RuleInput& r) {
  ValueId g = r.grads[0], a = in(r.node, 0), m = in(r.node, 1);
  Grads grads;
  if (r.needsGrad(a)) grads.push_back({a, r.b.call("aten::mm", {Arg::tensor(g), Arg::tensor(mT(r.b, m))})});
  if (r.needsGrad(m)) grads.push_back({m, r.b.call("aten::mm", {Arg::tensor(mT(r.b, a)), Arg::tensor(g)})});
  return grads;
}

Grads bmmRule(RuleInput& r) {
  ValueId g = r.grads[0], a = in(r.node, 0), m = in(r.node, 1);
  Grads grads;
  if (r.needsGrad(a)) grads.push_back({a, r.b.call("aten::bmm", {Arg::tensor(g), Arg::tensor(mT(r.b, m))})});
  if (r.needsGrad(m)) grads.push_back({m, r.b.call("aten::bmm", {Arg::tensor(mT(r.b, a)), Arg::tensor(g)})});
  return grads;
}

Grads addmmRule(RuleInput& r) {
  const Node& n = r.node;
  ValueId g = r.grads[0], self = in(n, 0), m1 = in(n, 1), m2 = in(n, 2);
  const double beta = scalarAt(n, 3), alpha = scalarAt(n, 4);
  Grads grads;
  auto scaled = [&](ValueId v, double s) { return s == 1.0 ? v : r.b.mulScalar(v, s); };
  if (r.needsGrad(self)) grads.push_back({self, r.b.sumTo(scaled(g, beta), r.b.shape(self))});
  if (r.needsGrad(m1)) grads.push_back({m1, scaled(r.b.call("aten::mm", {Arg::tensor(g), Arg::tensor(mT(r.b, m2))}), alpha)});
  if (r.needsGrad(m2)) grads.push_back({m2, scaled(r.b.call("aten::mm", {Arg::tensor(mT(r.b, m1)), Arg::tensor(g)}), alpha)});
  return grads;
}

// matmul with numpy broadcasting: 1-D operands are promoted to matrices,
// the batched product is differentiated, and the promotion undone.
Grads matmulRule(RuleInput& r) {
  GraphBuilder& b = r.b;
  ValueId g = r.grads[0], a = in(r.node, 0), m = in(r.node, 1);
  const auto aShape = b.shape(a), mShape = b.shape(m);
  if (aShape.size() == 1 && mShape.size() == 1) {  // dot product
    Grads grads;
    if (r.needsGrad(a)) grads.push_back({a, b.mul(g, m)});
    if (r.needsGrad(m)) grads.push_back({m, b.mul(g, a)});
    return grads;
  }
  ValueId a2 = a, m2 = m, g2 = g;
  if (aShape.size() == 1) {
    a2 = b.reshape(a, {1, aShape[0]});
    g2 = b.call("aten::unsqueeze", {Arg::tensor(g2), Arg::ofInt(-2)});
  }
  if (mShape.size() == 1) {
    m2 = b.reshape(m, {mShape[0], 1});
    g2 = b.call("aten::unsqueeze", {Arg::tensor(g2), Arg::ofInt(-1)});
  }
  Grads grads;
  if (r.needsGrad(a)) {
    ValueId ga = b.call("aten::matmul", {Arg::tensor(g2), Arg::tensor(mT(b, m2))});
    grads.push_back({a, b.reshape(b.sumTo(ga, b.shape(a2)), aShape)});
  }
  if (r.needsGrad(m)) {
    ValueId gm = b.call("aten::matmul", {Arg::tensor(mT(b, a2)), Arg::tensor(g2)});
    grads.push_back({m, b.reshape(b.sumTo(gm, b.shape(m2)), mShape)});
  }
  return grads;
}

// ---- shape and layout ops ----------------------------------------------------

// Ops whose gradient is the output gradient reshaped back to the input.
Grads reshapeBackRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  return {{x, r.b.reshape(r.grads[0], r.b.shape(x))}};
}

Grads identityRule(RuleInput& r) { return {{in(r.node, 0), r.grads[0]}}; }

Grads tRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  if (r.b.shape(x).size() < 2) return {{x, r.grads[0]}};
  return {{x, r.b.call("aten::t", {Arg::tensor(r.grads[0])})}};
}

Grads transposeRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.transpose(r.grads[0], intAt(r.node, 1), intAt(r.node, 2))}};
}

Grads permuteRule(RuleInput& r) {
  const auto& dims = intsAt(r.node, 1);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[normalizeDim(dims[i], dims.size())] = static_cast<int64_t>(i);
  return {{in(r.node, 0), r.b.call("aten::permute", {Arg::tensor(r.grads[0]), intsArg(inverse)})}};
}

Grads expandRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  return {{x, r.b.sumTo(r.grads[0], r.b.shape(x))}};
}

Grads sliceRule(RuleInput& r) {
  const Node& n = r.node;
  ValueId x = in(n, 0);
  const int64_t start = isNone(n, 2) ? 0 : intAt(n, 2);
  const int64_t end = isNone(n, 3) ? std::numeric_limits<int64_t>::max() : intAt(n, 3);
  return {{x, r.b.call("aten::slice_backward", {Arg::tensor(r.grads[0]), intsArg(r.b.shape(x)), Arg::ofInt(intAt(n, 1)),
                                                  Arg::ofInt(start), Arg::ofInt(end), Arg::ofInt(intAt(n, 4))})}};
}

Grads selectRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  return {{x, r.b.call("aten::select_backward", {Arg::tensor(r.grads[0]), intsArg(r.b.shape(x)),
                                                   Arg::ofInt(intAt(r.node, 1)), Arg::ofInt(intAt(r.node, 2))})}};
}

Grads catRule(RuleInput& r) {
  const auto& parts = r.node.args.at(0).values;
  const int64_t dim = normalizeDim(intAt(r.node, 1), r.b.shape(out(r.node)).size());
  Grads grads;
  int64_t offset = 0;
  for (ValueId part : parts) {
    const int64_t size = r.b.shape(part)[dim];
    if (r.needsGrad(part)) {
      grads.push_back({part, r.b.call("aten::slice.Tensor", {Arg::tensor(r.grads[0]), Arg::ofInt(dim), Arg::ofInt(offset),
                                                             Arg::ofInt(offset + size), Arg::ofInt(1)})});
    }
    offset += size;
  }
  return grads;
}

// split / split_with_sizes / chunk: the pieces' gradients concatenated,
// zeros standing in for pieces no gradient reached.
Grads splitRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  const int64_t dim = normalizeDim(intAt(r.node, 2), r.b.shape(x).size());
  Arg pieces;
  pieces.kind = Arg::Kind::Values;
  for (size_t k = 0; k < r.node.outputs.size(); ++k) {
    pieces.values.push_back(r.grads[k] != kNoValue ? r.grads[k] : r.b.zerosLike(r.node.outputs[k]));
  }
  return {{x, r.b.call("aten::cat", {pieces, Arg::ofInt(dim)})}};
}

Grads broadcastTensorsRule(RuleInput& r) {
  Grads grads;
  const auto& inputs = r.node.args.at(0).values;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (r.grads[k] != kNoValue && r.needsGrad(inputs[k])) {
      grads.push_back({inputs[k], r.b.sumTo(r.grads[k], r.b.shape(inputs[k]))});
    }
  }
  return grads;
}

// ---- elementwise arithmetic ----------------------------------------------------

Grads addRule(RuleInput& r, double otherSign) {
  const Node& n = r.node;
  ValueId g = r.grads[0], self = in(n, 0);
  Grads grads;
  if (r.needsGrad(self)) grads.push_back({self, r.b.sumTo(g, r.b.shape(self))});
  if (n.args[1].kind == Arg::Kind::Value && r.needsGrad(in(n, 1))) {
    const double scale = otherSign * scalarAt(n, 2);
    ValueId go = scale == 1.0 ? g : scale == -1.0 ? r.b.neg(g) : r.b.mulScalar(g, scale);
    grads.push_back({in(n, 1), r.b.sumTo(go, r.b.shape(in(n, 1)))});
  }
  return grads;
}
Grads addTensorRule(RuleInput& r) { return addRule(r, 1.0); }
Grads subTensorRule(RuleInput& r) { return addRule(r, -1.0); }

Grads rsubScalarRule(RuleInput& r) {
  const double alpha = scalarAt(r.node, 2);
  return {{in(r.node, 0), alpha == 1.0 ? r.b.neg(r.grads[0]) : r.b.mulScalar(r.grads[0], -alpha)}};
}

Grads mulTensorRule(RuleInput& r) {
  ValueId g = r.grads[0], a = in(r.node, 0), m = in(r.node, 1);
  Grads grads;
  if (r.needsGrad(a)) grads.push_back({a, r.b.sumTo(r.b.mul(g, m), r.b.shape(a))});
  if (r.needsGrad(m)) grads.push_back({m, r.b.sumTo(r.b.mul(g, a), r.b.shape(m))});
  return grads;
}

Grads mulScalarRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::mul.Scalar", {Arg::tensor(r.grads[0]), r.node.args[1]})}};
}

Grads divTensorRule(RuleInput& r) {
  ValueId g = r.grads[0], a = in(r.node, 0), m = in(r.node, 1);
  Grads grads;
  if (r.needsGrad(a)) {
    grads.push_back({a, r.b.sumTo(r.b.call("aten::div.Tensor", {Arg::tensor(g), Arg::tensor(m)}), r.b.shape(a))});
  }
  if (r.needsGrad(m)) {
    // -grad * ((self / other) / other)
    ValueId q = r.b.call("aten::div.Tensor", {Arg::tensor(a), Arg::tensor(m)});
    q = r.b.call("aten::div.Tensor", {Arg::tensor(q), Arg::tensor(m)});
    grads.push_back({m, r.b.sumTo(r.b.mul(r.b.neg(g), q), r.b.shape(m))});
  }
  return grads;
}

Grads divScalarRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::div.Scalar", {Arg::tensor(r.grads[0]), r.node.args[1]})}};
}

Grads negRule(RuleInput& r) { return {{in(r.node, 0), r.b.neg(r.grads[0])}}; }

Grads powScalarRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  const double e = scalarAt(r.node, 1);
  if (e == 0.0) return {{x, r.b.zerosLike(x)}};
  // grad * (exponent * self.pow(exponent - 1))
  ValueId p = r.b.call("aten::pow.Tensor_Scalar", {Arg::tensor(x), scalarArg(e - 1.0)});
  ValueId d = r.b.call("aten::mul.Scalar", {Arg::tensor(p), scalarArg(e)});
  return {{x, r.b.mul(r.grads[0], d)}};
}

Grads sqrtRule(RuleInput& r) {  // grad / (2 * result)
  ValueId twice = r.b.call("aten::mul.Scalar", {Arg::tensor(out(r.node)), Arg::ofInt(2)});
  return {{in(r.node, 0), r.b.call("aten::div.Tensor", {Arg::tensor(r.grads[0]), Arg::tensor(twice)})}};
}

Grads rsqrtRule(RuleInput& r) {  // -0.5 * grad * result.pow(3)
  ValueId g = r.b.mulScalar(r.grads[0], -0.5);
  ValueId cube = r.b.call("aten::pow.Tensor_Scalar", {Arg::tensor(out(r.node)), Arg::ofInt(3)});
  return {{in(r.node, 0), r.b.mul(g, cube)}};
}

Grads expRule(RuleInput& r) { return {{in(r.node, 0), r.b.mul(r.grads[0], out(r.node))}}; }

Grads logRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::div.Tensor", {Arg::tensor(r.grads[0]), Arg::tensor(in(r.node, 0))})}};
}

// ---- activations -------------------------------------------------------------

Grads reluRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::threshold_backward", {Arg::tensor(r.grads[0]), Arg::tensor(out(r.node)), Arg::ofInt(0)})}};
}

Grads geluRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::gelu_backward", {Arg::tensor(r.grads[0]), Arg::tensor(in(r.node, 0)), r.node.args[1]})}};
}

Grads siluRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::silu_backward", {Arg::tensor(r.grads[0]), Arg::tensor(in(r.node, 0))})}};
}

Grads tanhRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::tanh_backward", {Arg::tensor(r.grads[0]), Arg::tensor(out(r.node))})}};
}

Grads sigmoidRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::sigmoid_backward", {Arg::tensor(r.grads[0]), Arg::tensor(out(r.node))})}};
}

Grads softmaxLikeRule(RuleInput& r, const char* backwardOp) {
  ValueId x = in(r.node, 0);
  return {{x, r.b.call(backwardOp, {Arg::tensor(r.grads[0]), Arg::tensor(out(r.node)), Arg::ofInt(intAt(r.node, 1)),
                                    dtypeArg(r.b.value(x).dtype)})}};
}
Grads softmaxRule(RuleInput& r) { return softmaxLikeRule(r, "aten::_softmax_backward_data"); }
Grads logSoftmaxRule(RuleInput& r) { return softmaxLikeRule(r, "aten::_log_softmax_backward_data"); }

Grads dropoutRule(RuleInput& r) { return {{in(r.node, 0), r.grads[0]}}; }
std::string dropoutUnsupported(const Node& n) {
  return scalarAt(n, 1) != 0.0 && boolAt(n, 2) ? "dropout with p > 0 in training mode (random masks) is not supported"
                                                : "";
}

Grads triuRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::triu", {Arg::tensor(r.grads[0]), r.node.args[1]})}};
}

Grads maskedFillRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::masked_fill.Scalar", {Arg::tensor(r.grads[0]), Arg::tensor(in(r.node, 1)), Arg::ofInt(0)})}};
}

// ---- reductions and losses -------------------------------------------------------

// The gradient of a reduction: `g` reshaped to keep the reduced dims, then
// expanded over the input. `inShape` by value: appending nodes may move the
// graph's values, and with them a referenced shape.
ValueId expandReduced(GraphBuilder& b, ValueId g, const std::vector<int64_t> inShape, const Arg& dims) {
  std::vector<int64_t> kept = inShape;
  const bool all = dims.kind == Arg::Kind::None || dims.ints.empty();
  for (size_t d = 0; d < kept.size(); ++d) {
    bool reduced = all;
    for (int64_t dim : dims.ints) reduced = reduced || normalizeDim(dim, inShape.size()) == static_cast<int64_t>(d);
    if (reduced) kept[d] = 1;
  }
  ValueId shaped = b.reshape(g, kept);
  return b.call("aten::expand", {Arg::tensor(shaped), intsArg(inShape), Arg::ofBool(false)});
}

int64_t reducedCount(const std::vector<int64_t>& inShape, const std::vector<int64_t>& outShape) {
  int64_t in = std::accumulate(inShape.begin(), inShape.end(), int64_t{1}, std::multiplies<int64_t>());
  int64_t o = std::accumulate(outShape.begin(), outShape.end(), int64_t{1}, std::multiplies<int64_t>());
  return o == 0 ? 0 : in / o;
}

Grads sumRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  return {{x, expandReduced(r.b, r.grads[0], r.b.shape(x), Arg::none())}};
}

Grads sumDimRule(RuleInput& r) {
  ValueId x = in(r.node, 0);
  return {{x, expandReduced(r.b, r.grads[0], r.b.shape(x), r.node.args[1])}};
}

Grads meanLikeRule(RuleInput& r, const Arg& dims) {
  ValueId x = in(r.node, 0);
  ValueId e = expandReduced(r.b, r.grads[0], r.b.shape(x), dims);
  const int64_t count = reducedCount(r.b.shape(x), r.b.shape(out(r.node)));
  return {{x, r.b.call("aten::div.Scalar", {Arg::tensor(e), Arg::ofInt(count)})}};
}
Grads meanRule(RuleInput& r) { return meanLikeRule(r, Arg::none()); }
Grads meanDimRule(RuleInput& r) { return meanLikeRule(r, r.node.args[1]); }

Grads nllLossForwardRule(RuleInput& r) {
  const Node& n = r.node;
  ValueId self = in(n, 0);
  return {{self, r.b.call("aten::nll_loss_backward", {Arg::tensor(r.grads[0]), Arg::tensor(self), n.args[1], n.args[2],
                                                      n.args[3], n.args[4], Arg::tensor(out(n, 1))})}};
}

Grads mseLossRule(RuleInput& r) {
  const Node& n = r.node;
  ValueId self = in(n, 0), target = in(n, 1);
  Grads grads;
  auto backward = [&](ValueId a, ValueId b) {
    return r.b.call("aten::mse_loss_backward", {Arg::tensor(r.grads[0]), Arg::tensor(a), Arg::tensor(b), n.args[2]});
  };
  if (r.needsGrad(self)) grads.push_back({self, backward(self, target)});
  if (r.needsGrad(target)) grads.push_back({target, backward(target, self)});
  return grads;
}

// ---- normalization, embedding, convolution, pooling -----------------------------

// Appends a backward op with a bool[3] output_mask and maps its three
// results onto (input, weight, bias) arguments at the given positions.
Grads threeWayBackward(RuleInput& r, const std::string& op, std::vector<Arg> args, std::array<int, 3> argPos) {
  std::vector<bool> mask(3, false);
  for (int k = 0; k < 3; ++k) mask[k] = !isNone(r.node, argPos[k]) && r.needsGrad(in(r.node, argPos[k]));
  args.push_back(boolsArg(mask));
  auto results = r.b.callMulti(op, std::move(args), "grad");
  Grads grads;
  for (int k = 0; k < 3; ++k) {
    if (mask[k]) grads.push_back({in(r.node, argPos[k]), results.at(k)});
  }
  return grads;
}

Grads nativeLayerNormRule(RuleInput& r) {
  const Node& n = r.node;
  return threeWayBackward(r, "aten::native_layer_norm_backward",
                          {Arg::tensor(r.grads[0]), n.args[0], n.args[1], Arg::tensor(out(n, 1)), Arg::tensor(out(n, 2)),
                           n.args[2], n.args[3]},
                          {0, 2, 3});
}

Grads batchNormTrainRule(RuleInput& r) {
  const Node& n = r.node;  // (input, weight, bias, running_mean, running_var, momentum, eps)
  return threeWayBackward(r, "aten::native_batch_norm_backward",
                          {Arg::tensor(r.grads[0]), n.args[0], n.args[1], n.args[3], n.args[4], Arg::tensor(out(n, 1)),
                           Arg::tensor(out(n, 2)), Arg::ofBool(true), n.args[6]},
                          {0, 1, 2});
}

Grads convolutionLike(RuleInput& r, bool transposed, const std::vector<int64_t>& outputPadding, size_t groupsArg) {
  const Node& n = r.node;
  Arg biasSizes = isNone(n, 2) ? Arg::none() : intsArg(r.b.shape(in(n, 2)));
  return threeWayBackward(r, "aten::convolution_backward",
                          {Arg::tensor(r.grads[0]), n.args[0], n.args[1], biasSizes, n.args[3], n.args[4], n.args[5],
                           Arg::ofBool(transposed), intsArg(outputPadding), n.args[groupsArg]},
                          {0, 1, 2});
}

Grads convNdRule(RuleInput& r) {  // conv1d/2d/3d(input, weight, bias, stride, padding, dilation, groups)
  const size_t spatial = r.b.shape(in(r.node, 1)).size() - 2;
  return convolutionLike(r, false, std::vector<int64_t>(spatial, 0), 6);
}

Grads convolutionRule(RuleInput& r) {  // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
  return convolutionLike(r, boolAt(r.node, 6), intsAt(r.node, 7), 8);
}

Grads embeddingRule(RuleInput& r) {
  const Node& n = r.node;  // (weight, indices, padding_idx, scale_grad_by_freq, sparse)
  ValueId w = in(n, 0);
  return {{w, r.b.call("aten::embedding_dense_backward", {Arg::tensor(r.grads[0]), n.args[1], Arg::ofInt(r.b.shape(w)[0]),
                                                          n.args[2], n.args[3]})}};
}

Grads maxPool2dWithIndicesRule(RuleInput& r) {
  const Node& n = r.node;
  return {{in(n, 0), r.b.call("aten::max_pool2d_with_indices_backward",
                              {Arg::tensor(r.grads[0]), n.args[0], n.args[1], n.args[2], n.args[3], n.args[4], n.args[5],
                               Arg::tensor(out(n, 1))})}};
}

Grads avgPool2dRule(RuleInput& r) {
  const Node& n = r.node;
  return {{in(n, 0), r.b.call("aten::avg_pool2d_backward", {Arg::tensor(r.grads[0]), n.args[0], n.args[1], n.args[2],
                                                             n.args[3], n.args[4], n.args[5], n.args[6]})}};
}

Grads adaptiveAvgPool2dRule(RuleInput& r) {
  return {{in(r.node, 0), r.b.call("aten::_adaptive_avg_pool2d_backward", {Arg::tensor(r.grads[0]), r.node.args[0]})}};
}

const std::map<std::string, DerivativeRule>& rules() {
  static const std::map<std::string, DerivativeRule> table = {
      {"aten::linear", {linearRule}},
      {"aten::addmm", {addmmRule}},
      {"aten::mm", {mmRule}},
      {"aten::bmm", {bmmRule}},
      {"aten::matmul", {matmulRule}},
      {"aten::t", {tRule}},
      {"aten::transpose.int", {transposeRule}},
      {"aten::permute", {permuteRule}},
      {"aten::view", {reshapeBackRule}},
      {"aten::reshape", {reshapeBackRule}},
      {"aten::_unsafe_view", {reshapeBackRule}},
      {"aten::flatten.using_ints", {reshapeBackRule}},
      {"aten::unsqueeze", {reshapeBackRule}},
      {"aten::squeeze", {reshapeBackRule}},
      {"aten::squeeze.dim", {reshapeBackRule}},
      {"aten::contiguous", {identityRule}},
      {"aten::clone", {identityRule}},
      {"aten::expand", {expandRule}},
      {"aten::slice.Tensor", {sliceRule}},
      {"aten::select.int", {selectRule}},
      {"aten::cat", {catRule}},
      {"aten::split.Tensor", {splitRule}},
      {"aten::split_with_sizes", {splitRule}},
      {"aten::chunk", {splitRule}},
      {"aten::broadcast_tensors", {broadcastTensorsRule}},
      {"aten::add.Tensor", {addTensorRule}},
      {"aten::add.Scalar", {identityRule}},
      {"aten::sub.Tensor", {subTensorRule}},
      {"aten::sub.Scalar", {identityRule}},
      {"aten::rsub.Scalar", {rsubScalarRule}},
      {"aten::mul.Tensor", {mulTensorRule}},
      {"aten::mul.Scalar", {mulScalarRule}},
      {"aten::div.Tensor", {divTensorRule}},
      {"aten::div.Scalar", {divScalarRule}},
      {"aten::neg", {negRule}},
      {"aten::pow.Tensor_Scalar", {powScalarRule}},
      {"aten::sqrt", {sqrtRule}},
      {"aten::rsqrt", {rsqrtRule}},
      {"aten::exp", {expRule}},
      {"aten::log", {logRule}},
      {"aten::relu", {reluRule}},
      {"aten::gelu", {geluRule}},
      {"aten::silu", {siluRule}},
      {"aten::tanh", {tanhRule}},
      {"aten::sigmoid", {sigmoidRule}},
      {"aten::softmax.int", {softmaxRule}},
      {"aten::_softmax", {softmaxRule}},
      {"aten::log_softmax.int", {logSoftmaxRule}},
      {"aten::_log_softmax", {logSoftmaxRule}},
      {"aten::dropout", {dropoutRule, dropoutUnsupported}},
      {"aten::triu", {triuRule}},
      {"aten::masked_fill.Scalar", {maskedFillRule}},
      {"aten::sum", {sumRule}},
      {"aten::sum.dim_IntList", {sumDimRule}},
      {"aten::mean", {meanRule}},
      {"aten::mean.dim", {meanDimRule}},
      {"aten::nll_loss_forward", {nllLossForwardRule}},
      {"aten::mse_loss", {mseLossRule}},
      {"aten::native_layer_norm", {nativeLayerNormRule}},
      {"spmd::batch_norm_train", {batchNormTrainRule}},
      {"aten::conv1d", {convNdRule}},
      {"aten::conv2d", {convNdRule}},
      {"aten::conv3d", {convNdRule}},
      {"aten::convolution", {convolutionRule}},
      {"aten::embedding", {embeddingRule}},
      {"aten::max_pool2d_with_indices", {maxPool2dWithIndicesRule}},
      {"aten::avg_pool2d", {avgPool2dRule}},
      {"aten::adaptive_avg_pool2d", {adaptiveAvgPool2dRule}},
  };
  return table;
}

}  // namespace

const DerivativeRule* findDerivative(const Node& node) {
  auto it = rules().find(node.qualifiedName());
  return it == rules().end() ? nullptr : &it->second;
}

std::vector<std::string> differentiableOps() {
  std::vector<std::string> ops;
  for (const auto& [name, _] : rules()) ops.push_back(name);
  ops.push_back("aten::layer_norm");
  ops.push_back("aten::max_pool2d");
  ops.push_back("aten::cross_entropy_loss");
  ops.push_back("aten::nll_loss");
  ops.push_back("aten::nll_loss_nd");
  ops.push_back("aten::scaled_dot_product_attention");
  std::sort(ops.begin(), ops.end());
  return ops;
}

}  // namespace spmd
