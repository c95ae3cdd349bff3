// The float formulas of the pointwise ops and the device helpers they call,
// for the generated kernels' source (cuda_codegen.cpp). Internal to ops/.
#pragma once

#include "spmd/ops/pointwise_program.h"

#include <c10/core/ScalarType.h>

#include <set>
#include <string>

namespace spmd {

// A CUDA float literal for `value` (inf and NaN as bit patterns).
std::string floatLiteral(double value);

// An operand of a statement: its input (aK), temporary (tK) or constant.
std::string operandExpr(const PointwiseOperand& o);

// The device function computing the tanh GELU for a step rounded to `t`;
// its gradient is the same name with "_grad".
std::string geluTanhName(c10::ScalarType t);

// Each op's float formula, as ATen's CUDA kernel computes it in float.
std::string opExpr(const PointwiseStatement& s);

// spmd_philox: a bernoulli statement's random words (ops/pointwise_program.h).
std::string philoxHelpers();

// The device helpers a kernel needs: the 16-bit conversions of `dtypes`, the
// tanh GELU functions named in `geluTanh` (geluTanhName) and the helpers of
// `ops`, in a fixed order.
std::string prelude(const std::set<c10::ScalarType>& dtypes, const std::set<std::string>& geluTanh,
                    const std::set<PointwiseOp>& ops);

}  // namespace spmd
