// spmd::grouped_mm(Tensor input, Tensor weight, Tensor offs): a mixture of
// experts' per-expert products. `input` (S, K) holds rows sorted by expert,
// `weight` (E, K, N) an expert's matrix each, `offs` (E) where each expert's
// rows end (cumulative counts); row r of the result (S, N) is
// input[r] @ weight[e] for the expert e whose rows hold r, and rows past
// offs[E-1] are zero. It is what ATen's _grouped_mm (torch 2.8 and later)
// computes for a 2-D input and 3-D weight, and what transformers'
// grouped_mm_fallback computes; the .pt2 importer puts it in place of both
// where the linked LibTorch has no _grouped_mm (export_trace.cpp).
//
// Autograd sees one node, whose backward is spmd::grouped_mm again (the
// input's gradient, through the transposed weights) and
// spmd::grouped_mm_weight_grad (each expert's rows' input^T @ grad), so
// spmd-expand records the pair. Each is a loop of ATen mm over the groups:
// the offsets are read on the host (one sync a call on CUDA).
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

namespace spmd {
namespace {

// Where each group's rows end, on the host, checked against the rows there are.
std::vector<int64_t> groupEnds(const at::Tensor& offs, int64_t groups, int64_t rows) {
  TORCH_CHECK(offs.dim() == 1 && offs.size(0) == groups, "spmd::grouped_mm: offs of ", offs.sizes(), " for ", groups,
              " groups");
  TORCH_CHECK(!c10::isFloatingType(offs.scalar_type()), "spmd::grouped_mm: offs must be integers, not ",
              offs.scalar_type());
  const at::Tensor host = offs.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> ends(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + groups);
  int64_t start = 0;
  for (int64_t end : ends) {
    TORCH_CHECK(end >= start && end <= rows, "spmd::grouped_mm: offsets ", offs.sizes(),
                " do not rise within the ", rows, " rows");
    start = end;
  }
  return ends;
}

void checkOperands(const at::Tensor& input, const at::Tensor& weight) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 3 && input.size(1) == weight.size(1),
              "spmd::grouped_mm: input ", input.sizes(), " and weight ", weight.sizes(),
              " are no (S, K) rows and (E, K, N) matrices");
}

at::Tensor groupedMm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offs) {
  checkOperands(input, weight);
  const std::vector<int64_t> ends = groupEnds(offs, weight.size(0), input.size(0));
  at::Tensor out = at::zeros({input.size(0), weight.size(2)}, input.options());
  int64_t start = 0;
  for (size_t e = 0; e < ends.size(); ++e) {
    if (ends[e] > start) {
      at::Tensor rows = out.narrow(0, start, ends[e] - start);
      at::mm_out(rows, input.narrow(0, start, ends[e] - start), weight[static_cast<int64_t>(e)]);
    }
    start = ends[e];
  }
  return out;
}

at::Tensor groupedMmWeightGrad(const at::Tensor& input, const at::Tensor& grad, const at::Tensor& offs,
                               int64_t groups) {
  const std::vector<int64_t> ends = groupEnds(offs, groups, input.size(0));
  at::Tensor out = at::zeros({groups, input.size(1), grad.size(1)}, grad.options());
  int64_t start = 0;
  for (int64_t e = 0; e < groups; ++e) {
    if (ends[e] > start) {
      const int64_t n = ends[e] - start;
      at::Tensor slot = out[e];
      at::mm_out(slot, input.narrow(0, start, n).t(), grad.narrow(0, start, n));
    }
    start = ends[e];
  }
  return out;
}

at::Tensor groupedMmMeta(const at::Tensor& input, const at::Tensor& weight, const at::Tensor&) {
  checkOperands(input, weight);
  return at::empty({input.size(0), weight.size(2)}, input.options());
}

at::Tensor groupedMmWeightGradMeta(const at::Tensor& input, const at::Tensor& grad, const at::Tensor&,
                                   int64_t groups) {
  return at::empty({groups, input.size(1), grad.size(1)}, grad.options());
}

// The ops through the dispatcher, below autograd, so that a recording sees them.
at::Tensor callGroupedMm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offs) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("spmd::grouped_mm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(input, weight, offs);
}

at::Tensor callGroupedMmWeightGrad(const at::Tensor& input, const at::Tensor& grad, const at::Tensor& offs,
                                   int64_t groups) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("spmd::grouped_mm_weight_grad", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(input, grad, offs, groups);
}

class GroupedMmFunction : public torch::autograd::Function<GroupedMmFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& offs) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({input, weight, offs});
    return callGroupedMm(input, weight, offs);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &offs = saved[2];
    at::AutoDispatchBelowADInplaceOrView below;
    torch::autograd::variable_list result(3);
    if (ctx->needs_input_grad(0)) {
      result[0] = callGroupedMm(grads[0], weight.transpose(1, 2), offs);
    }
    if (ctx->needs_input_grad(1)) {
      result[1] = callGroupedMmWeightGrad(input, grads[0], offs, weight.size(0));
    }
    return result;
  }
};

at::Tensor groupedMmAutograd(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offs) {
  return GroupedMmFunction::apply(input, weight, offs);
}

// aten::_grouped_mm for a 2-D input and 3-D weights with offsets, the form
// transformers' experts call, as spmd::grouped_mm.
at::Tensor atenGroupedMm(const at::Tensor& self, const at::Tensor& mat2, const std::optional<at::Tensor>& offs,
                         const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> outDtype) {
  TORCH_CHECK(offs && !bias && (!outDtype || *outDtype == self.scalar_type()),
              "aten::_grouped_mm: spmd takes a 2-D input and 3-D weights with offsets, no bias and no other "
              "result dtype (this LibTorch has no _grouped_mm of its own)");
  return callGroupedMm(self, mat2, *offs);
}

// LibTorch before 2.8 has no aten::_grouped_mm, which a TorchScript trace of
// transformers' experts calls (it would not load): there it is defined once,
// as spmd::grouped_mm, dispatched through it so that autograd and the meta
// device see spmd's op. A LibTorch that has one keeps its own.
void defineAtenGroupedMm() {
  if (c10::Dispatcher::singleton().findSchema({"aten::_grouped_mm", ""})) return;
  static torch::Library library(torch::Library::FRAGMENT, "aten", std::nullopt, __FILE__, __LINE__);
  library.def(
      "_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None, ScalarType? out_dtype=None) "
      "-> Tensor");
  library.impl("_grouped_mm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(atenGroupedMm));
}

}  // namespace

void ensureGroupedMmOpsRegistered() {
  static const bool defined = (defineAtenGroupedMm(), true);
  (void)defined;
}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) {
  m.def("grouped_mm(Tensor input, Tensor weight, Tensor offs) -> Tensor");
  m.def("grouped_mm_weight_grad(Tensor input, Tensor grad, Tensor offs, int groups) -> Tensor");
}

TORCH_LIBRARY_IMPL(spmd, CompositeExplicitAutograd, m) {
  m.impl("grouped_mm", &spmd::groupedMm);
  m.impl("grouped_mm_weight_grad", &spmd::groupedMmWeightGrad);
}

TORCH_LIBRARY_IMPL(spmd, Meta, m) {
  m.impl("grouped_mm", &spmd::groupedMmMeta);
  m.impl("grouped_mm_weight_grad", &spmd::groupedMmWeightGradMeta);
}

TORCH_LIBRARY_IMPL(spmd, Autograd, m) { m.impl("grouped_mm", &spmd::groupedMmAutograd); }
