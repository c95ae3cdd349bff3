// spmd::fused_adam: torch.optim's fused Adam/AdamW (ATen's _fused_adam_ and
// _fused_adamw_, one multi-tensor kernel for every parameter of a group) as
// a functional op: it returns the new parameters, moments and steps (in one
// list, in that order) instead of writing its arguments (the graph is SSA), and increments the steps
// first, as torch.optim does before calling the kernel. spmd-lower puts it
// in place of the optimizer's per-parameter ops on CUDA (passes/fused_adam.cpp).
// The .tensor_lr overload takes a scheduled rate as a tensor (ATen's
// .tensor_lr overloads), so a captured step follows the schedule.
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

// Updates params, exp_avgs, exp_avg_sqs and steps where they are. `lr`: a
// double, or (the .tensor_lr overload) a tensor on the device.
void updateInPlace(const std::vector<at::Tensor>& p, at::TensorList grads, const std::vector<at::Tensor>& m,
                   const std::vector<at::Tensor>& v, const std::vector<at::Tensor>& s, const c10::IValue& lr,
                   double beta1, double beta2, double weightDecay, double eps, bool adamw) {
  at::_foreach_add_(s, 1);
  auto list = [](const std::vector<at::Tensor>& ts) { return c10::IValue(c10::List<at::Tensor>(ts)); };
  const std::string op = std::string(adamw ? "aten::_fused_adamw_" : "aten::_fused_adam_") + (lr.isTensor() ? ".tensor_lr" : "");
  callByArgumentName(op,
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
}

std::vector<at::Tensor> vec(at::TensorList ts) { return std::vector<at::Tensor>(ts.begin(), ts.end()); }

// The functional form: the update applied to copies.
std::vector<at::Tensor> callFusedAdam(at::TensorList params, at::TensorList grads, at::TensorList expAvgs,
                                      at::TensorList expAvgSqs, at::TensorList steps, const c10::IValue& lr, double beta1,
                                      double beta2, double weightDecay, double eps, bool adamw) {
  std::vector<at::Tensor> p = clones(params), m = clones(expAvgs), v = clones(expAvgSqs), s = clones(steps);
  updateInPlace(p, grads, m, v, s, lr, beta1, beta2, weightDecay, eps, adamw);
  return concat({p, m, v, s});
}

std::vector<at::Tensor> fusedAdam(at::TensorList params, at::TensorList grads, at::TensorList expAvgs, at::TensorList expAvgSqs,
                                  at::TensorList steps, double lr, double beta1, double beta2, double weightDecay, double eps,
                                  bool adamw) {
  return callFusedAdam(params, grads, expAvgs, expAvgSqs, steps, lr, beta1, beta2, weightDecay, eps, adamw);
}

// A scheduled rate: the graph's f64 input, given to the kernel as the
// float32 tensor torch.optim passes for a tensor lr.
std::vector<at::Tensor> fusedAdamTensorLr(at::TensorList params, at::TensorList grads, at::TensorList expAvgs,
                                          at::TensorList expAvgSqs, at::TensorList steps, const at::Tensor& lr, double beta1,
                                          double beta2, double weightDecay, double eps, bool adamw) {
  return callFusedAdam(params, grads, expAvgs, expAvgSqs, steps, lr.to(at::kFloat), beta1, beta2, weightDecay, eps, adamw);
}

// spmd::fused_adam_: the in-place form, which the interpreter runs where
// the parameters, moments and steps die at the update (runtime/interpreter.cpp).
void fusedAdamInPlace(at::TensorList params, at::TensorList grads, at::TensorList expAvgs, at::TensorList expAvgSqs,
                      at::TensorList steps, double lr, double beta1, double beta2, double weightDecay, double eps,
                      bool adamw) {
  updateInPlace(vec(params), grads, vec(expAvgs), vec(expAvgSqs), vec(steps), lr, beta1, beta2, weightDecay, eps, adamw);
}

void fusedAdamInPlaceTensorLr(at::TensorList params, at::TensorList grads, at::TensorList expAvgs,
                              at::TensorList expAvgSqs, at::TensorList steps, const at::Tensor& lr, double beta1,
                              double beta2, double weightDecay, double eps, bool adamw) {
  updateInPlace(vec(params), grads, vec(expAvgs), vec(expAvgSqs), vec(steps), lr.to(at::kFloat), beta1, beta2,
                weightDecay, eps, adamw);
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

std::vector<at::Tensor> fusedAdamTensorLrMeta(at::TensorList params, at::TensorList grads, at::TensorList expAvgs,
                                              at::TensorList expAvgSqs, at::TensorList steps, const at::Tensor&, double beta1,
                                              double beta2, double weightDecay, double eps, bool adamw) {
  return fusedAdamMeta(params, grads, expAvgs, expAvgSqs, steps, 0.0, beta1, beta2, weightDecay, eps, adamw);
}

}  // namespace

void ensureFusedOptimizerOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) {
  m.def(
      "fused_adam(Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, Tensor[] steps, "
      "float lr, float beta1, float beta2, float weight_decay, float eps, bool adamw) -> Tensor[]");
  m.def(
      "fused_adam.tensor_lr(Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, Tensor[] steps, "
      "Tensor lr, float beta1, float beta2, float weight_decay, float eps, bool adamw) -> Tensor[]");
  m.def(
      "fused_adam_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] steps, float lr, float beta1, float beta2, float weight_decay, float eps, bool adamw) -> ()");
  m.def(
      "fused_adam_.tensor_lr(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] steps, Tensor lr, float beta1, float beta2, float weight_decay, float eps, bool adamw) -> ()");
}

TORCH_LIBRARY_IMPL(spmd, Meta, m) {
  m.impl("fused_adam", &spmd::fusedAdamMeta);
  m.impl("fused_adam.tensor_lr", &spmd::fusedAdamTensorLrMeta);
}

TORCH_LIBRARY_IMPL(spmd, CUDA, m) {
  m.impl("fused_adam", &spmd::fusedAdam);
  m.impl("fused_adam.tensor_lr", &spmd::fusedAdamTensorLr);
  m.impl("fused_adam_", &spmd::fusedAdamInPlace);
  m.impl("fused_adam_.tensor_lr", &spmd::fusedAdamInPlaceTensorLr);
}
