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
//
// A row program also reduces over the last dimension of the iteration space
// (softmax, RMSNorm and their backward; sums over the last dimension):
//
//   t0:f32 = mul(in0, in0); t1:f32 = row_sum(t0); t2:f32 = mul(in0, t1); return t2, t1
//
// `row_sum` and `row_max` give one value a row, and so does every statement
// computed only from such values, constants and inputs that are the same
// along a row (last dimension 1, or broadcast there): its "row level". A
// result written `row(tK)` is one value a row, of the iteration space's
// shape with the last dimension 1 (tK must be at row level); any other
// result has the iteration space's shape (a row-level one repeated along the
// row). The reductions accumulate in float and round once, as ATen's do.
//
// `bernoulli(inS, p, v)` is dropout's scaled mask (spmd-lower's
// dropout-mask-in-kernel): v with probability p, else 0 (v rounded to the statement's
// dtype), drawn again wherever a program needs the mask rather than stored.
// inS is a 0-dim int64 input, the seed (spmd::dropout_seed); element i of
// the iteration space (row-major) draws word i % 4 of Philox4x32-10 with key
// `seed` and counter (i / 4, 0), as at::philox_engine(seed, 0, i / 4) gives
// them, and keeps where keepsElement(word, p). The same seed gives the same
// mask in every program over the same iteration space. Row programs take no
// bernoulli.
//
// `pair(a, b)` stacks two values along the iteration space's last
// dimension, which must have size 2: a at index 0, b at index 1 (a
// torch.stack([a, b], -1) whose operands the program computes, as a rotary
// embedding's pairs). The program's inputs broadcast along that dimension.
// Its results are laid out contiguously, and row programs take no pair.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

// The operations a statement may apply. Each names its ATen counterpart's
// formula; the `_grad` ones are the backward ops (gelu_backward, ...).
enum class PointwiseOp {
  Add, Sub, Mul, Div, Neg, Relu, ThresholdGrad, Gelu, GeluGrad, GeluTanh, GeluTanhGrad,
  Tanh, TanhGrad, Sigmoid, SigmoidGrad, Silu, SiluGrad, Exp, Log, Sqrt, Rsqrt, Pow, Cast,
  Lerp,            // lerp(start, end, weight), ATen's two-sided formula (Adam's first moment)
  Pair,            // pair(a, b): a stack of two along the last dimension (see above)
  RowSum, RowMax,  // over the last dimension (see above)
  Bernoulli,       // dropout's mask from a seed input (see above)
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
  std::vector<bool> perRow;  // per result: written row(tK)
};

// Whether a Bernoulli statement keeps an element whose random word is
// `word`: its top 24 bits as a fraction of 2^24 (exact in float) below p.
inline bool keepsElement(uint32_t word, float p) { return static_cast<float>(word >> 8) * 0x1p-24f < p; }
// The smallest word keepsElement(word, p) does not keep, 2^32 where it keeps
// every word: keepsElement(w, p) is w < keepBound(p), one integer compare.
uint64_t keepBound(float p);

// `value` in float, rounded to `t` (f32, bf16 or f16) as a statement of
// dtype t rounds its result.
float roundedTo(c10::ScalarType t, double value);

// The value dropout keeps an element at, a bernoulli's v: 1 / divisor in float
// (as ATen's CUDA div by a number computes it) rounded to the mask's dtype.
double dropoutScale(c10::ScalarType mask, double divisor);

// The inputs that bernoulli statements read as their seed.
std::vector<int> seedInputs(const PointwiseProgram& program);

bool isRowReduction(PointwiseOp op);
bool hasPairs(const PointwiseProgram& program);
// Throws std::invalid_argument where a program with pairs runs over an
// iteration space whose last dimension is not 2, or reduces rows.
void checkPairs(const PointwiseProgram& program, const std::vector<int64_t>& shape);
bool hasRowReductions(const PointwiseProgram& program);
// Whether an input of shape `input` is the same along each row of the
// iteration space `shape` (it broadcasts along the last dimension).
bool constantAlongRows(const std::vector<int64_t>& input, const std::vector<int64_t>& shape);
// Per statement: whether it has one value a row (see above), for inputs of
// `inputShapes` over the iteration space `shape`. All false for a program
// without reductions. Throws std::invalid_argument where a row(tK) result
// names a statement that is not at row level.
std::vector<bool> rowLevelStatements(const PointwiseProgram& program,
                                     const std::vector<std::vector<int64_t>>& inputShapes,
                                     const std::vector<int64_t>& shape);
bool isPerRowResult(const PointwiseProgram& program, size_t r);
// The shape of result `r` over the iteration space `shape` (row(tK): its
// last dimension 1).
std::vector<int64_t> resultShape(const PointwiseProgram& program, size_t r, const std::vector<int64_t>& shape);

// The dtypes a program computes in (its values' and inputs' dtypes).
bool isPointwiseDtype(c10::ScalarType t);

// Throws std::invalid_argument naming the character offset and what was
// expected. Checks that operands refer to earlier statements, that a
// bernoulli's operands are an input and two constants, and that the program
// returns at least one statement.
PointwiseProgram parsePointwiseProgram(std::string_view text);
std::string printPointwiseProgram(const PointwiseProgram& program);
// A constant as the text form and generated code spell it: the shortest
// decimal that reads back as the same float (the kernels compute in float).
std::string constantText(double value);

}  // namespace spmd
