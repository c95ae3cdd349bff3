// relu-to-gemm-epilogue (spmd-lower runs it for --device cuda): a ReLU after a Linear
// with a bias becomes one matrix multiply with the bias and the ReLU in its
// epilogue, ATen's _addmm_activation (cuBLASLt's RELU_BIAS epilogue on CUDA;
// addmm and relu on the CPU):
//
//   %l: f32[M,N] = aten::linear(%x, %w, %b)        (%x: [M,K], %w: [N,K], %b: [N])
//   %y: f32[M,N] = aten::relu(%l)
//     -> %w_t = aten::t(%w)
//        %y = aten::_addmm_activation(%b, %x, %w_t, 1, 1, False)
//
// One kernel fewer a layer, and the pre-activation is never written (the
// backward's threshold_backward reads %y). The values are the same: the
// GEMM is the one aten::linear runs (addmm with the bias), and ReLU is
// exact. Taken: a 2-D input, a bias, one dtype, the Linear's result read
// only by the ReLU. Others stay as they are; a ReLU after a Linear that is
// not taken gets a note. GELU is not taken: its backward reads the
// pre-activation, which the epilogue does not keep.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <string>

namespace spmd {
namespace {

// Why relu(linear) cannot become _addmm_activation ("" when it can).
std::string whyNot(const Graph& g, const Node& linear, ValueId pre) {
  if (linear.args.size() != 3 || linear.args[2].kind != Arg::Kind::Value) return "a Linear without a bias";
  const Value &x = g.value(linear.args[0].value), &w = g.value(linear.args[1].value),
              &b = g.value(linear.args[2].value);
  if (x.shape.size() != 2 || w.shape.size() != 2 || b.shape.size() != 1) return "an input that is not 2-D";
  if (x.dtype != w.dtype || x.dtype != b.dtype) return "inputs of different dtypes";
  if (!g.hasOneReader(pre)) return "the Linear's result is read by more than the ReLU";
  return "";
}

class ReluOfLinear final : public RewritePattern {
 public:
  ReluOfLinear() : RewritePattern("relu-of-linear", {"aten::relu"}), linear_(OpName::known("aten::linear")) {}

  MatchResult matchAndRewrite(Graph& g, const Node& relu) override {
    const Node* linear = producerOf(g, relu, 0, linear_);
    if (relu.args.size() != 1 || !linear) return MatchResult::skip();
    const ValueId pre = relu.args[0].value;
    if (const std::string why = whyNot(g, *linear, pre); !why.empty()) return MatchResult::failure(why);
    const Arg x = linear->args[0], w = linear->args[1], b = linear->args[2];
    GraphBuilder builder(g);
    builder.setMeta(relu.meta);
    builder.setInsertionPoint(relu);
    const ValueId wt = builder.call("aten::t", {w}, g.value(w.value).name + "_t");
    builder.replace(relu, "aten::_addmm_activation",
                    {b, x, Arg::tensor(wt), Arg::ofInt(1), Arg::ofInt(1), Arg::ofBool(false)});
    g.erase(*linear);
    return MatchResult::success();
  }

 private:
  OpName linear_;
};

class LinearReluPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    const int fused = applyPatternsNotingFailures(g, {&pattern_},
                                                  diagnostics, "relu-to-gemm-epilogue: not fused: ").total();
    count("Linear+ReLU as _addmm_activation (the ReLU in the GEMM's epilogue)", fused);
    return fused > 0;
  }

 private:
  ReluOfLinear pattern_;
};

}  // namespace

std::unique_ptr<Pass> createLinearReluPass(const PipelineOptions&) { return std::make_unique<LinearReluPass>(); }

}  // namespace spmd
