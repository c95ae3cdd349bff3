// channels-last (spmd-lower, --device cuda, --memory-format): 2-D
// convolutions and their backward read their 4-D tensors in channels-last
// memory order, so that cuDNN runs its NHWC kernels without transposing
// around every convolution, as torch.compile lays out convolution nets:
//
//   %y = aten::conv2d(%x, %w, ...)
//     -> %x.cl = aten::contiguous(%x, torch.channels_last)
//        %y = aten::conv2d(%x.cl, %w.cl, ...)
//
// The convolution's result is then channels-last, and BatchNorm, ReLU,
// residual adds and pooling keep that layout (ATen's kernels follow their
// inputs'), so the conversions after the first are free at run time:
// `contiguous` returns a tensor already in that order as it is. A value is
// converted once, where it is first read, for the forward and the backward
// alike (convolution_backward gets the same channels-last input and weight,
// and its weight gradient comes back in the weight's layout). A weight's
// autocast cast that only convolutions read writes channels-last itself (its
// memory_format), with no conversion after it. Parameters keep their layout:
// the optimizer, buckets and checkpoints see the tensors they did. Values
// are the same up to the convolution algorithms cuDNN picks for the layout.
//
// A `view` that a channels-last value no longer allows (a classifier's
// `x.view(n, -1)`, the backward of a reshape after a convolution) becomes
// `reshape`, which copies where the strides require it, as eager does for a
// channels-last tensor's reshape.
//
// `auto` (the default) converts a graph with at least kAutoConvolutions
// 2-D convolutions (a convolution net, not a vision transformer's patch
// embedding); `channels-last` any; `contiguous` none.
#include "spmd/ir/builder.h"
#include "spmd/ir/op_name.h"
#include "spmd/ir/verify.h"
#include "spmd/passes/pass.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace spmd {
namespace {

constexpr int kAutoConvolutions = 2;

struct Ops {
  OpName conv2d = OpName::known("aten::conv2d");
  OpName convolution = OpName::known("aten::convolution");
  OpName convTranspose2d = OpName::known("aten::conv_transpose2d.input");
  OpName convolutionBackward = OpName::known("aten::convolution_backward");
  OpName toCopy = OpName::known("aten::_to_copy");
  OpName view = OpName::known("aten::view");
  OpName unsafeView = OpName::known("aten::_unsafe_view");
};
const Ops& ops() { return opTable<Ops>(); }

// The arguments of a convolution node that are its 4-D tensors in memory
// (input and weight; convolution_backward's gradient too); empty for other nodes.
std::vector<size_t> layoutArgs(const Graph& g, const Node& n) {
  const Ops& o = ops();
  std::vector<size_t> candidates;
  if (n.is(o.conv2d) || n.is(o.convolution) || n.is(o.convTranspose2d)) candidates = {0, 1};
  if (n.is(o.convolutionBackward)) candidates = {0, 1, 2};
  std::vector<size_t> args;
  for (size_t i : candidates) {
    if (i < n.args.size() && n.args[i].kind == Arg::Kind::Value && g.value(n.args[i].value).shape.size() == 4) {
      args.push_back(i);
    }
  }
  return args;
}

bool isForwardConvolution(const Graph& g, const Node& n) {
  return !n.is(ops().convolutionBackward) && !layoutArgs(g, n).empty();
}

Arg channelsLast() {
  Arg a;
  a.kind = Arg::Kind::MemoryFormat;
  a.i = static_cast<int64_t>(c10::MemoryFormat::ChannelsLast);
  return a;
}

// Whether `v` is a cast (aten::_to_copy with no memory format of its own)
// that only convolutions read as a laid-out argument.
bool castOnlyConvolutionsRead(const Graph& g, ValueId v) {
  const Node* cast = g.producer(v);
  if (!cast || !cast->is(ops().toCopy) || cast->args.size() != 7 || cast->args[6].kind != Arg::Kind::None) return false;
  if (g.readBeyondNodes(v)) return false;
  for (const Node* user : g.users(v)) {
    for (size_t k = 0; k < user->args.size(); ++k) {
      const bool reads = user->args[k].kind == Arg::Kind::Value && user->args[k].value == v;
      const std::vector<size_t> laid = layoutArgs(g, *user);
      if (reads && std::find(laid.begin(), laid.end(), k) == laid.end()) return false;
      for (ValueId listed : user->args[k].values) {
        if (listed == v) return false;
      }
    }
  }
  return true;
}

// Whether `n` is a view of a tensor whose strides (`meta`) it cannot view.
bool viewTheStridesRefuse(const Graph& g, const std::vector<at::Tensor>& meta, const Node& n) {
  if (!(n.is(ops().view) || n.is(ops().unsafeView)) || n.args.size() != 2) return false;
  if (n.args[0].kind != Arg::Kind::Value || n.outputs.size() != 1) return false;
  const at::Tensor& in = meta[n.args[0].value];
  if (!in.defined() || in.is_contiguous()) return false;
  try {
    in.view(g.value(n.outputs[0]).shape);
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}

// The conversions whose input is already channels-last, gone (their readers
// read the input); how many. Dropping one changes no value's strides, so
// `meta` stays good for what follows.
int dropConversionsOfChannelsLast(Graph& g, const std::vector<at::Tensor>& meta,
                                  const std::vector<const Node*>& conversions) {
  int dropped = 0;
  for (const Node* n : conversions) {
    const at::Tensor& in = meta[n->args[0].value];
    if (!in.defined() || !in.is_contiguous(c10::MemoryFormat::ChannelsLast)) continue;
    g.replaceAllUsesWith(n->outputs[0], n->args[0].value);
    g.erase(*n);
    ++dropped;
  }
  return dropped;
}

// Views that the new layouts (`meta`) refuse, as reshapes; how many.
int reshapeRefusedViews(Graph& g, const std::vector<at::Tensor>& meta) {
  std::vector<const Node*> refused;
  for (const Node& n : g.nodes()) {
    if (viewTheStridesRefuse(g, meta, n)) refused.push_back(&n);
  }
  for (const Node* n : refused) {
    GraphBuilder b(g);
    b.setMeta(n->meta);
    b.replace(*n, "aten::reshape", {n->args[0], n->args[1]});
  }
  return static_cast<int>(refused.size());
}

class ChannelsLastPass final : public Pass {
 public:
  explicit ChannelsLastPass(std::string mode) : mode_(std::move(mode)) {}

  bool run(Graph& g, DiagnosticEngine&) override {
    std::vector<const Node*> convolutions;
    int forward = 0;
    for (const Node& n : g.nodes()) {
      if (layoutArgs(g, n).empty()) continue;
      convolutions.push_back(&n);
      forward += isForwardConvolution(g, n);
    }
    const bool convert = mode_ == "channels-last" || (mode_ == "auto" && forward >= kAutoConvolutions);
    if (!convert || convolutions.empty()) {
      count("convolution(s) in channels-last memory order", 0);
      return false;
    }
    std::map<ValueId, ValueId> converted;
    std::vector<const Node*> conversionNodes;
    int casts = 0;
    for (const Node* n : convolutions) {
      for (size_t i : layoutArgs(g, *n)) {
        const ValueId v = n->args[i].value;
        auto it = converted.find(v);
        if (it == converted.end()) {
          if (castOnlyConvolutionsRead(g, v)) {
            g.constantArg(*g.producer(v), 6) = channelsLast();
            ++casts;
            it = converted.emplace(v, v).first;
          } else {
            GraphBuilder b(g);
            b.setMeta(n->meta);
            b.setInsertionPoint(*n);
            it = converted.emplace(v, b.call("aten::contiguous", {Arg::tensor(v), channelsLast()},
                                             g.value(v).name + ".cl")).first;
            conversionNodes.push_back(g.producer(it->second));
          }
        }
        if (it->second != v) g.setArg(*n, i, Arg::tensor(it->second));
      }
    }
    count("convolution(s) in channels-last memory order", static_cast<int64_t>(convolutions.size()));
    const std::vector<at::Tensor> meta = metaValues(g);
    const int dropped = dropConversionsOfChannelsLast(g, meta, conversionNodes);
    count("conversion(s) to channels-last", static_cast<int64_t>(conversionNodes.size()) - dropped);
    count("conversion(s) of values already channels-last left out", dropped);
    count("cast(s) writing channels-last", casts);
    count("view(s) of channels-last values as reshapes", reshapeRefusedViews(g, meta));
    return true;
  }

 private:
  std::string mode_;
};

}  // namespace

std::unique_ptr<Pass> createChannelsLastPass(const PipelineOptions& options) {
  return std::make_unique<ChannelsLastPass>(options.lower.memoryFormat);
}

}  // namespace spmd
