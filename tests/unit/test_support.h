// Helpers shared by the unit tests that read files and compare tensors.
// Include after LibTorch's headers and before nothing else of Catch's: it
// includes catch.h itself.
#pragma once

#include "spmd/io/input_spec.h"

#include <ATen/ATen.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "catch.h"

namespace spmd::testing {

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The --input specs of samples/NAME.inputs.
inline std::vector<InputSpec> sampleSpecs(const std::string& name) {
  std::istringstream in(readFile(std::string(SPMD_SOURCE_DIR) + "/samples/" + name + ".inputs"));
  std::vector<std::string> specs;
  std::string word;
  while (in >> word) {
    if (word != "--input") specs.push_back(word);
  }
  return parseInputSpecs(specs);
}

// allclose in float64 with the given tolerances, reporting the worst difference.
inline void requireClose(const at::Tensor& ours, const at::Tensor& ref, const std::string& what, double rtol,
                         double atol) {
  INFO(what << ": max abs diff " << (ours.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>());
  REQUIRE(ours.sizes() == ref.sizes());
  CHECK(at::allclose(ours.to(at::kDouble), ref.to(at::kDouble), rtol, atol));
}

// torch::optim's state entry for parameter `p`: keyed by its TensorImpl.
template <typename State>
auto findOptimizerState(State& all, const at::Tensor& p) {
  return all.find(static_cast<typename State::key_type>(p.unsafeGetTensorImpl()));
}

}  // namespace spmd::testing
