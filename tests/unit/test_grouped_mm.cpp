// spmd::grouped_mm (mixtures of experts' grouped GEMMs) against LibTorch's
// autograd over the same products written per expert with at::mm.
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

at::Tensor groupedMm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offs) {
  ensureSpmdOpsRegistered();
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("spmd::grouped_mm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(input, weight, offs);
}

// Each expert's rows times its matrix, rows past the last offset zero.
at::Tensor perExpert(const at::Tensor& input, const at::Tensor& weight, const std::vector<int64_t>& ends) {
  std::vector<at::Tensor> pieces;
  int64_t start = 0;
  for (size_t e = 0; e < ends.size(); ++e) {
    pieces.push_back(at::mm(input.narrow(0, start, ends[e] - start), weight[static_cast<int64_t>(e)]));
    start = ends[e];
  }
  pieces.push_back(at::zeros({input.size(0) - start, weight.size(2)}, input.options()));
  return at::cat(pieces);
}

}  // namespace

TEST_CASE("grouped_mm and its gradients are the per-expert products'", "[ops]") {
  at::manual_seed(3);
  // Expert 1 has no rows; the last row belongs to none.
  const std::vector<int64_t> ends = {3, 3, 7, 9};
  const at::Tensor offs = at::tensor(ends, at::kInt);
  const at::Tensor input = at::randn({10, 5}, at::kDouble).requires_grad_();
  const at::Tensor weight = at::randn({4, 5, 3}, at::kDouble).requires_grad_();
  const at::Tensor seed = at::randn({10, 3}, at::kDouble);

  const at::Tensor ours = groupedMm(input, weight, offs);
  const at::Tensor expected = perExpert(input, weight, ends);
  CHECK(at::equal(ours, expected));
  CHECK(at::equal(ours.narrow(0, 9, 1), at::zeros({1, 3}, at::kDouble)));

  const auto ourGrads = torch::autograd::grad({ours}, {input, weight}, {seed});
  const auto expectedGrads = torch::autograd::grad({expected}, {input, weight}, {seed});
  CHECK(at::allclose(ourGrads[0], expectedGrads[0], 1e-12, 1e-12));
  CHECK(at::allclose(ourGrads[1], expectedGrads[1], 1e-12, 1e-12));
  // The unused expert's matrix gets a zero gradient.
  CHECK(at::equal(ourGrads[1][1], at::zeros({5, 3}, at::kDouble)));
}

TEST_CASE("grouped_mm refuses offsets that do not rise within the rows", "[ops]") {
  const at::Tensor input = at::randn({4, 2});
  const at::Tensor weight = at::randn({2, 2, 2});
  CHECK_THROWS_AS(groupedMm(input, weight, at::tensor(std::vector<int64_t>{3, 1}, at::kInt)), c10::Error);
  CHECK_THROWS_AS(groupedMm(input, weight, at::tensor(std::vector<int64_t>{2, 5}, at::kInt)), c10::Error);
  CHECK_THROWS_AS(groupedMm(input, weight, at::tensor(std::vector<int64_t>{4}, at::kInt)), c10::Error);
  CHECK_THROWS_AS(groupedMm(input, at::randn({2, 3, 2}), at::tensor(std::vector<int64_t>{2, 4}, at::kInt)), c10::Error);
}
