// eager-batch-norm (spmd-lower runs it for --device cuda): training-mode
// BatchNorm runs the kernels eager PyTorch runs on CUDA. spmd-expand records
// BatchNorm as spmd::batch_norm_train and its backward as
// native_batch_norm_backward, ATen's native kernels; on CUDA eager's
// batch_norm goes through _batch_norm_with_update, which picks cuDNN's
// kernels where cuDNN takes the input (fp32, fp16 with fp32 weights, ...)
// and the native ones elsewhere, and hands cuDNN's reserve space to
// batch_norm_backward, which picks the same. Their rounding differs, and
// the differences grow through a network's BatchNorm layers; so here
//
//   %y, %mean, %invstd, %rm', %rv' = spmd::batch_norm_train(%x, %w, %b, %rm, %rv, momentum, eps)
//   %dx, %dw, %db = aten::native_batch_norm_backward(%dy, %x, %w, %rm', %rv', %mean, %invstd, True, eps, mask)
//     -> %y, %mean, %invstd, %reserve, %rm', %rv' =
//            aten::_batch_norm_with_update_functional(%x, %w, %b, %rm, %rv, momentum, eps)
//        %dx, %dw, %db = aten::batch_norm_backward(%dy, %x, %w, %rm', %rv', %mean, %invstd, True, eps, mask, %reserve)
//
// so that ATen makes eager's choice at run time, forward and backward
// alike. Taken: a BatchNorm with a weight (batch_norm_backward needs one)
// whose backward is found; others keep the native kernels, with a note.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <string>

namespace spmd {
namespace {

// The native_batch_norm_backward of `bn`: it reads bn's saved mean.
const Node* backwardOf(const Graph& g, const Node& bn) {
  for (const Node* u : g.users(bn.outputs[1])) {
    static const OpName kBackward = OpName::known("aten::native_batch_norm_backward");
    if (u->is(kBackward) && u->args[5].kind == Arg::Kind::Value &&
        u->args[5].value == bn.outputs[1]) {
      return u;
    }
  }
  return nullptr;
}

class BatchNormAsEager final : public RewritePattern {
 public:
  BatchNormAsEager() : RewritePattern("batch-norm-as-eager", {"spmd::batch_norm_train"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& bn) override {
    const Node* backward = backwardOf(g, bn);
    if (bn.args[1].kind != Arg::Kind::Value) return MatchResult::failure("a BatchNorm without a weight");
    replace(g, bn, backward);
    return MatchResult::success();
  }

 private:
  static void replace(Graph& g, const Node& bn, const Node* backward);
};

class EagerBatchNormPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    BatchNormAsEager pattern;
    const int taken = applyPatternsNotingFailures(g, {&pattern},
                                                  diagnostics, "eager-batch-norm: native kernels kept: ").total();
    count("BatchNorm(s) through _batch_norm_with_update's choice of kernels (cuDNN where eager uses it)", taken);
    return taken > 0;
  }
};

void BatchNormAsEager::replace(Graph& g, const Node& bn, const Node* backward) {
  GraphBuilder b(g);
  b.setMeta(bn.meta);
  const std::vector<ValueId> old = bn.outputs;  // y, mean, invstd, running mean, running var
  const std::vector<ValueId> outputs = {old[0], old[1], old[2], kNoValue, old[3], old[4]};
  b.replace(bn, "aten::_batch_norm_with_update_functional", bn.args, outputs);
  const ValueId reserve = g.producer(old[0])->outputs[3];
  g.value(reserve).name = g.value(old[0]).name + ".reserve";
  if (!backward) return;
  b.setMeta(backward->meta);
  std::vector<Arg> args = backward->args;
  args.push_back(Arg::tensor(reserve));
  b.replace(*backward, "aten::batch_norm_backward", args);
}

}  // namespace

std::unique_ptr<Pass> createEagerBatchNormPass(const PipelineOptions&) { return std::make_unique<EagerBatchNormPass>(); }

}  // namespace spmd
