// repeat-kv-to-gqa (spmd-lower runs it for --device cuda, after
// attention-to-fused-kernel): k and v that the model repeated to q's heads
// before cuDNN's attention (transformers' repeat_kv: expand then reshape, a
// copy of each) go to the kernel unrepeated, as grouped-query heads, and
// the backward's sums of each kv head's gradients over its query heads are
// the kernel's own:
//
//   %e = aten::expand(unsqueeze(%k, 2), [B, Hkv, n, S, D])        (full slices between: none)
//   %r = aten::reshape(%e, [B, Hkv * n, S, D])
//   %r.bf16 = aten::_to_copy(%r, torch.bfloat16, ...)             (optional: autocast's cast)
//   %o, ... = spmd::fused_attention(%q, %r.bf16, %rv, ..., "cudnn")
//   %dq, %dk, %dv = spmd::fused_attention_backward(%g, %q, %r.bf16, %rv, ..., "cudnn")
//   %w = aten::view([cast](%dk), [B, Hkv, n, S, D]); %s = aten::sum(%w, [2], True)
//     -> %k.bf16 = aten::_to_copy(%k, torch.bfloat16, ...)
//        %o, ... = spmd::fused_attention(%q, %k.bf16, %v, ..., "cudnn")
//        %dq, %dk2, %dv2 = spmd::fused_attention_backward(%g, %q, %k.bf16, %v, ..., "cudnn")
//        %s = aten::unsqueeze([cast](%dk2), 2)
//
// The forward's values are the same, bit for bit (each query head reads its
// kv head's values). The gradients are summed over the group inside the
// kernel in fp32 and rounded to k's dtype once, where the model's backward
// rounded each head's gradient and summed those: close, not the same bits.
// Taken only where every reader is one of these (the repeat's copies then
// go); cuDNN only, whose kernel takes grouped heads (LibTorch 2.11; an older
// LibTorch repeats them inside the op).
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"

#include <optional>
#include <vector>

namespace spmd {
namespace {

struct Ops {
  OpName attention = OpName::known("spmd::fused_attention");
  OpName attentionBackward = OpName::known("spmd::fused_attention_backward");
  OpName expand = OpName::known("aten::expand");
  OpName unsqueeze = OpName::known("aten::unsqueeze");
  OpName slice = OpName::known("aten::slice.Tensor");
  OpName reshape = OpName::known("aten::reshape");
  OpName view = OpName::known("aten::view");
  OpName unsafeView = OpName::known("aten::_unsafe_view");
  OpName toCopy = OpName::known("aten::_to_copy");
  OpName sum = OpName::known("aten::sum.dim_IntList");
  OpName fused = OpName::known("spmd::fused");
};
const Ops& ops() { return opTable<Ops>(); }

bool isReshape(const Node& n) { return n.is(ops().reshape) || n.is(ops().view) || n.is(ops().unsafeView); }

// Whether `n` is a slice that keeps its whole dimension.
bool isWholeSlice(const Graph& g, const Node& n) {
  if (!n.is(ops().slice) || n.args.size() != 5 || n.args[0].kind != Arg::Kind::Value) return false;
  const Value& in = g.value(n.args[0].value);
  const int64_t dim = n.args[1].i < 0 ? n.args[1].i + static_cast<int64_t>(in.shape.size()) : n.args[1].i;
  const bool fromStart = n.args[2].kind == Arg::Kind::None || (n.args[2].kind == Arg::Kind::Int && n.args[2].i == 0);
  const bool toEnd =
      n.args[3].kind == Arg::Kind::None || (n.args[3].kind == Arg::Kind::Int && n.args[3].i >= in.shape[dim]);
  return fromStart && toEnd && n.args[4].kind == Arg::Kind::Int && n.args[4].i == 1;
}

// A k or v the model repeated: the unrepeated [B, Hkv, S, D] tensor, the
// repeat count, and the cast autocast made of the repeat (or nullptr).
struct Repeated {
  ValueId source = kNoValue;
  int64_t groups = 1;
  const Node* cast = nullptr;
};

// Skips whole slices.
const Node* producerPastSlices(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  while (n && isWholeSlice(g, *n) && g.hasOneReader(n->args[0].value)) n = g.producer(n->args[0].value);
  return n;
}

std::optional<Repeated> repeatedOf(const Graph& g, ValueId read) {
  Repeated r;
  const Node* n = g.producer(read);
  if (n && n->is(ops().toCopy)) {
    r.cast = n;
    n = g.producer(n->args[0].value);
  }
  if (!n || !isReshape(*n) || (r.cast && !g.hasOneReader(n->outputs[0]))) return std::nullopt;
  const std::vector<int64_t>& out = g.value(n->outputs[0]).shape;
  const Node* expand = producerPastSlices(g, n->args[0].value);
  if (!expand || !expand->is(ops().expand) || !g.hasOneReader(expand->outputs[0])) return std::nullopt;
  const std::vector<int64_t>& wide = g.value(expand->outputs[0]).shape;
  const Node* unsqueeze = producerPastSlices(g, expand->args[0].value);
  if (!unsqueeze || !unsqueeze->is(ops().unsqueeze) || unsqueeze->args[1].kind != Arg::Kind::Int ||
      unsqueeze->args[1].i != 2) {
    return std::nullopt;
  }
  r.source = unsqueeze->args[0].value;
  const std::vector<int64_t>& k = g.value(r.source).shape;
  if (k.size() != 4 || out.size() != 4 || wide.size() != 5) return std::nullopt;
  if (wide != std::vector<int64_t>{k[0], k[1], wide[2], k[2], k[3]}) return std::nullopt;
  if (out != std::vector<int64_t>{k[0], k[1] * wide[2], k[2], k[3]}) return std::nullopt;
  r.groups = wide[2];
  return r.groups > 1 ? std::optional<Repeated>(r) : std::nullopt;
}

bool isUpcast(const Node& n) {
  return n.is(ops().toCopy) || (n.is(ops().fused) && n.args.size() == 2 && n.args[0].kind == Arg::Kind::Values &&
                                n.args[0].values.size() == 1 && n.args[1].kind == Arg::Kind::Str &&
                                n.args[1].s == "t0:f32 = cast(in0); return t0");
}

// The sum over the repeat of a gradient of the repeated tensor: view to
// [B, Hkv, n, S, D] and sum over dimension 2 keeping it, with a cast before
// or after the view (autocast's upcast of the gradient). Returns the sum
// node and the cast (or nullptr).
std::optional<std::pair<const Node*, const Node*>> sumOverGroups(const Graph& g, ValueId grad, int64_t groups) {
  const Node* cast = nullptr;
  const Node* n = g.soleReader(grad);
  if (n && isUpcast(*n)) {
    cast = n;
    n = g.soleReader(n->outputs[0]);
  }
  if (!n || !isReshape(*n) || g.value(n->outputs[0]).shape.size() != 5 || g.value(n->outputs[0]).shape[2] != groups) {
    return std::nullopt;
  }
  n = g.soleReader(n->outputs[0]);
  if (n && !cast && isUpcast(*n)) {
    cast = n;
    n = g.soleReader(n->outputs[0]);
  }
  if (!n || !n->is(ops().sum) || n->args.size() < 3 || n->args[1].kind != Arg::Kind::Ints ||
      n->args[1].ints != std::vector<int64_t>{2} || n->args[2].kind != Arg::Kind::Bool || !n->args[2].b) {
    return std::nullopt;
  }
  return std::make_pair(n, cast);
}

bool isCudnn(const Node& n) {
  const Arg& kernel = argument(n, "kernel");
  return kernel.kind == Arg::Kind::Str && kernel.s == "cudnn";
}

// Rewrites `attention` and its backwards; returns whether it did.
bool rewrite(Graph& g, const Node& attention) {
  if (!isCudnn(attention)) return false;
  const ValueId key = argument(attention, "key").value, value = argument(attention, "value").value;
  const std::optional<Repeated> k = repeatedOf(g, key), v = repeatedOf(g, value);
  if (!k || !v || k->groups != v->groups) return false;
  // Every reader of the repeated k and v: this attention and its backwards,
  // each backward's k and v gradients summed over the groups.
  std::vector<const Node*> backwards;
  for (ValueId read : {key, value}) {
    for (const Node* r : g.users(read)) {
      if (r == &attention) continue;
      if (!r->is(ops().attentionBackward) || argument(*r, "key").value != key || argument(*r, "value").value != value) {
        return false;
      }
      if (std::find(backwards.begin(), backwards.end(), r) == backwards.end()) backwards.push_back(r);
    }
  }
  for (const Node* b : backwards) {
    if (!sumOverGroups(g, b->outputs[1], k->groups) || !sumOverGroups(g, b->outputs[2], k->groups)) return false;
  }

  GraphBuilder b(g);
  b.setMeta(attention.meta);
  b.setInsertionPoint(attention);
  auto unrepeated = [&](const Repeated& r) {
    if (!r.cast) return r.source;
    std::vector<Arg> args = r.cast->args;
    args[0] = Arg::tensor(r.source);
    return b.call("aten::_to_copy", args, g.value(r.source).name + ".grouped");
  };
  const ValueId kg = unrepeated(*k), vg = unrepeated(*v);
  std::vector<Arg> args = attention.args;
  args[argumentIndex(ops().attention, "key")] = Arg::tensor(kg);
  args[argumentIndex(ops().attention, "value")] = Arg::tensor(vg);
  b.replace(attention, "spmd::fused_attention", args);
  for (const Node* back : backwards) {
    const auto dk = *sumOverGroups(g, back->outputs[1], k->groups), dv = *sumOverGroups(g, back->outputs[2], k->groups);
    b.setMeta(back->meta);
    b.setInsertionPoint(*back);
    std::vector<Arg> backArgs = back->args;
    backArgs[argumentIndex(ops().attentionBackward, "key")] = Arg::tensor(kg);
    backArgs[argumentIndex(ops().attentionBackward, "value")] = Arg::tensor(vg);
    const std::vector<ValueId> grads = b.callMulti("spmd::fused_attention_backward", backArgs,
                                                   g.value(back->outputs[0]).name + ".grouped");
    g.replaceAllUsesWith(back->outputs[0], grads[0]);
    for (const auto& [sum, cast, grad] : {std::make_tuple(dk.first, dk.second, grads[1]),
                                           std::make_tuple(dv.first, dv.second, grads[2])}) {
      b.setMeta(sum->meta);
      b.setInsertionPoint(*sum);
      ValueId summed = grad;
      if (cast) {
        const std::string name = g.value(cast->outputs[0]).name;  // a copy: the builder adds values
        summed = b.cast(summed, g.value(cast->outputs[0]).dtype, name);
      }
      b.replace(*sum, "aten::unsqueeze", {Arg::tensor(summed), Arg::ofInt(2)});
    }
  }
  return true;  // the repeats, the old backwards and their views: dce's
}

class RepeatKvToGqaPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    // The attentions first: a rewrite replaces nodes after its attention
    // (the sums), which a walk over every node would meet freed.
    std::vector<const Node*> attentions;
    for (const Node* n : snapshot(g.nodes())) {
      if (n->is(ops().attention)) attentions.push_back(n);
    }
    int rewritten = 0;
    for (const Node* n : attentions) rewritten += rewrite(g, *n) ? 1 : 0;
    count("attention(s) read k and v as grouped-query heads instead of their repeats", rewritten);
    return rewritten > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createRepeatKvToGqaPass(const PipelineOptions&) { return std::make_unique<RepeatKvToGqaPass>(); }

}  // namespace spmd
