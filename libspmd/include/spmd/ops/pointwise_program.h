// The body of a generated pointwise kernel (spmd::fused): a straight-line
// program over one element of the iteration space, in a small text form that
// listings show as the fused node's string argument:
//
//   t0:f32 = add(in0, in1); t1:bf16 = gelu(t0); return t0, t1
//
// `inK` is the fused node's K-th input (broadcast to the iteration space),
// `tK` the K-th statement's result, and a number a constant. Every statement
// computes in float and then rounds to its dtype, as the ATen op it stands
// for rounds its result, so a program computes what its unfused ops do, up to
// how their kernels round inside (ATen's add with alpha may fuse its multiply
// and add; math functions differ by an ulp between implementations). The
// results named by `return` are the node's outputs, of the iteration space's
// shape.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <string_view>
#include <vector>

namespace spmd {

// The operations a statement may apply. Each names its ATen counterpart's
// formula; the `_grad` ones are the backward ops (gelu_backward, ...).
enum class PointwiseOp {
  Add, Sub, Mul, Div, Neg, Relu, ThresholdGrad, Gelu, GeluGrad, GeluTanh, GeluTanhGrad,
  Tanh, TanhGrad, Sigmoid, SigmoidGrad, Silu, SiluGrad, Exp, Log, Sqrt, Rsqrt, Pow, Cast,
};

struct PointwiseOpInfo {
  PointwiseOp op;
  const char* name;  // as the text form spells it
  int arity;
};
const PointwiseOpInfo& pointwiseOpInfo(PointwiseOp op);
const std::vector<PointwiseOpInfo>& pointwiseOps();

struct PointwiseOperand {
  enum class Kind { Input, Temp, Constant };
  Kind kind = Kind::Constant;
  int index = 0;         // Input: which input; Temp: which statement
  double constant = 0;   // Constant
};

struct PointwiseStatement {
  PointwiseOp op = PointwiseOp::Add;
  std::vector<PointwiseOperand> operands;
  c10::ScalarType dtype = c10::ScalarType::Float;  // the result is rounded to this
};

struct PointwiseProgram {
  int numInputs = 0;
  std::vector<PointwiseStatement> statements;
  std::vector<int> results;  // statement indices, in output order
};

// The dtypes a program computes in (its values' and inputs' dtypes).
bool isPointwiseDtype(c10::ScalarType t);

// Throws std::invalid_argument naming the character offset and what was
// expected. Checks that operands refer to earlier statements and that the
// program returns at least one statement.
PointwiseProgram parsePointwiseProgram(std::string_view text);
std::string printPointwiseProgram(const PointwiseProgram& program);
// A constant as the text form and generated code spell it: the shortest
// decimal that reads back as the same float (the kernels compute in float).
std::string constantText(double value);

}  // namespace spmd
