// spmd::fused_adam: torch.optim's fused Adam/AdamW (ATen's _fused_adam_ and
// _fused_adamw_, one multi-tensor kernel for every parameter of a group) as
// a functional op: it returns the new parameters, moments and steps (in one
// list, in that order) instead of writing its arguments (the graph is SSA), and increments the steps
// first, as torch.optim does before calling the kernel. spmd-lower puts it
// in place of the optimizer's per-parameter ops on CUDA (passes/fused_adam.cpp).
#include "spmd/ops/dispatch.h"
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace spmd {
namespace {

// The new parameters, exp_avgs, exp_avg_sqs and steps, one list after the
// other in one list (the graph holds a node's list results flattened, one
// list per node).
std::vector<at::Tensor> concat(std::initializer_list<std::vector<at::Tensor>> lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

std::vector<at::Tensor> clones(at::TensorList ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(t.clone());
  return out;
}

std::vector<at::Tensor> fusedAdam(at::TensorList params, at::TensorList grads, at::TensorList expAvgs, at::TensorList expAvgSqs,
                at::TensorList steps, double lr, double beta1, double beta2, double weightDecay, double eps,
                bool adamw) {
  std::vector<at::Tensor> p = clones(params), m = clones(expAvgs), v = clones(expAvgSqs), s = clones(steps);
  at::_foreach_add_(s, 1);
  auto list = [](const std::vector<at::Tensor>& ts) { return c10::IValue(c10::List<at::Tensor>(ts)); };
  callByArgumentName(adamw ? "aten::_fused_adamw_" : "aten::_fused_adam_",
                     {{"self", list(p)},
                      {"grads", list(std::vector<at::Tensor>(grads.begin(), grads.end()))},
                      {"exp_avgs", list(m)},
                      {"exp_avg_sqs", list(v)},
                      {"max_exp_avg_sqs", list({})},
                      {"state_steps", list(s)},
                      {"lr", lr},
                      {"beta1", beta1},
                      {"beta2", beta2},
                      {"weight_decay", weightDecay},
                      {"eps", eps},
                      {"amsgrad", false},
                      {"maximize", false}});
  return concat({p, m, v, s});
}

std::vector<at::Tensor> fusedAdamMeta(at::TensorList params, at::TensorList, at::TensorList expAvgs, at::TensorList expAvgSqs,
                    at::TensorList steps, double, double, double, double, double, bool) {
  auto like = [](at::TensorList ts) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : ts) out.push_back(at::empty_like(t));
    return out;
  };
  return concat({like(params), like(expAvgs), like(expAvgSqs), like(steps)});
}

}  // namespace

void ensureFusedOptimizerOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) {
  m.def(
      "fused_adam(Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, Tensor[] steps, "
      "float lr, float beta1, float beta2, float weight_decay, float eps, bool adamw) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(spmd, Meta, m) { m.impl("fused_adam", &spmd::fusedAdamMeta); }

TORCH_LIBRARY_IMPL(spmd, CUDA, m) { m.impl("fused_adam", &spmd::fusedAdam); }
