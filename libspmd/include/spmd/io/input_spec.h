// `--input NAME:DTYPE[d0,d1,...]`: the per-rank shape of one data input.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace spmd {

struct InputSpec {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
};

// Throws Diagnostic (where = "--input 'TEXT'") on bad syntax.
InputSpec parseInputSpec(const std::string& text);
std::vector<InputSpec> parseInputSpecs(const std::vector<std::string>& texts);

}  // namespace spmd
