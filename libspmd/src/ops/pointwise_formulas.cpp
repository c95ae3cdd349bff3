#include "pointwise_formulas.h"

#include "spmd/ops/cuda_emitter.h"

#include <cmath>
#include <set>
#include <stdexcept>

namespace spmd {

std::string floatLiteral(double value) {
  const std::string c = constantText(value);
  if (c == "inf") return "__int_as_float(0x7f800000)";
  if (c == "-inf") return "__int_as_float(0xff800000)";
  if (c == "nan") return "__int_as_float(0x7fc00000)";
  return c[0] == '-' ? "(" + c + "f)" : c + "f";
}

std::string operandExpr(const PointwiseOperand& o) {
  switch (o.kind) {
    case PointwiseOperand::Kind::Input: return "a" + std::to_string(o.index);
    case PointwiseOperand::Kind::Temp: return "t" + std::to_string(o.index);
    case PointwiseOperand::Kind::Constant: break;
  }
  return floatLiteral(o.constant);
}

namespace {
bool isSixteenBit(c10::ScalarType t) { return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half; }
}  // namespace

// A 16-bit step computes the tanh GELU as x * sigmoid(2 inner), without
// tanhf, whose cost bounded the kernel: on H200 the bf16 bias + GELU went
// from 65% to 71% of the copy bandwidth in spmd-kernel-bench (84% to 94% in a
// standalone kernel); see prelude(). f32 steps keep ATen's tanhf form.
std::string geluTanhName(c10::ScalarType t) { return isSixteenBit(t) ? "spmd_gelu_tanh16" : "spmd_gelu_tanh"; }

namespace {

// The kept value (rounded here, so that the statement needs no rounding) or
// 0, by one compare of the element's random word wK with keepBound.
std::string bernoulliExpr(const PointwiseStatement& s) {
  const uint64_t bound = keepBound(static_cast<float>(s.operands[1].constant));
  const std::string value = floatLiteral(roundedTo(s.dtype, s.operands[2].constant));
  if (bound == 0) return "0.0f";
  if (bound == uint64_t{1} << 32) return value;
  return "w" + std::to_string(s.operands[0].index) + " < " + std::to_string(bound) + "u ? " + value + " : 0.0f";
}

}  // namespace

std::string opExpr(const PointwiseStatement& s) {
  std::vector<std::string> a;
  for (const auto& o : s.operands) a.push_back(operandExpr(o));
  using P = PointwiseOp;
  switch (s.op) {
    case P::Add: return a[0] + " + " + a[1];
    case P::Sub: return a[0] + " - " + a[1];
    case P::Mul: return a[0] + " * " + a[1];
    case P::Div: return a[0] + " / " + a[1];
    case P::Neg: return "-" + a[0];
    case P::Relu: return a[0] + " <= 0.0f ? 0.0f : " + a[0];
    case P::ThresholdGrad: return a[1] + " <= " + a[2] + " ? 0.0f : " + a[0];
    case P::Gelu: return "spmd_gelu(" + a[0] + ")";
    case P::GeluGrad: return "spmd_gelu_grad(" + a[0] + ", " + a[1] + ")";
    case P::GeluTanh: return geluTanhName(s.dtype) + "(" + a[0] + ")";
    case P::GeluTanhGrad: return geluTanhName(s.dtype) + "_grad(" + a[0] + ", " + a[1] + ")";
    case P::Tanh: return "tanhf(" + a[0] + ")";
    case P::TanhGrad: return a[0] + " * (1.0f - " + a[1] + " * " + a[1] + ")";
    case P::Sigmoid: return "1.0f / (1.0f + expf(-" + a[0] + "))";
    case P::SigmoidGrad: return a[0] + " * (1.0f - " + a[1] + ") * " + a[1];
    case P::Silu: return a[0] + " / (1.0f + expf(-" + a[0] + "))";
    case P::SiluGrad: return "spmd_silu_grad(" + a[0] + ", " + a[1] + ")";
    // ATen's lerp: from the nearer end, so that weight 1 gives `end` exactly.
    case P::Lerp:
      return "(fabsf(" + a[2] + ") < 0.5f ? " + a[0] + " + " + a[2] + " * (" + a[1] + " - " + a[0] + ") : " + a[1] +
             " - (" + a[1] + " - " + a[0] + ") * (1.0f - " + a[2] + "))";
    case P::Exp: return "expf(" + a[0] + ")";
    case P::Log: return "logf(" + a[0] + ")";
    case P::Sqrt: return "sqrtf(" + a[0] + ")";
    case P::Rsqrt: return "rsqrtf(" + a[0] + ")";
    case P::Pow: break;
    case P::Cast: return a[0];
    // The element's index along the last dimension (of size 2) of the
    // iteration space, walked in its own order: i's lowest bit.
    case P::Pair: return "(i & 1) == 0 ? " + a[0] + " : " + a[1];
    case P::Bernoulli: return bernoulliExpr(s);
    case P::RowSum:
    case P::RowMax: throw std::logic_error("a row reduction outside a row kernel");
  }
  // ATen's pow with a scalar exponent special-cases these exponents.
  if (s.operands[1].kind != PointwiseOperand::Kind::Constant) return "powf(" + a[0] + ", " + a[1] + ")";
  const double e = s.operands[1].constant;
  if (e == 2) return a[0] + " * " + a[0];
  if (e == 3) return a[0] + " * " + a[0] + " * " + a[0];
  if (e == 0.5) return "sqrtf(" + a[0] + ")";
  if (e == -0.5) return "rsqrtf(" + a[0] + ")";
  if (e == -1) return "1.0f / " + a[0];
  if (e == -2) return "1.0f / (" + a[0] + " * " + a[0] + ")";
  return "powf(" + a[0] + ", " + a[1] + ")";
}

std::string prelude(const std::set<c10::ScalarType>& dtypes, const std::set<std::string>& geluTanh,
                    const std::set<PointwiseOp>& ops) {
  std::string s;
  if (dtypes.count(c10::ScalarType::BFloat16)) s += bfloat16Helpers();
  if (dtypes.count(c10::ScalarType::Half)) s += float16Helpers();
  using P = PointwiseOp;
  // ATen's constants, rounded to float as its opmath computes with them.
  const std::string alpha = floatLiteral(M_SQRT1_2), beta = floatLiteral(M_2_SQRTPI * M_SQRT1_2 * 0.5);
  const std::string tanhBeta = floatLiteral(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = floatLiteral(0.044715);
  if (ops.count(P::Gelu)) {
    s += "__device__ __forceinline__ float spmd_gelu(float x) {\n"
         "  return x * 0.5f * (1.0f + erff(x * " + alpha + "));\n}\n";
  }
  if (ops.count(P::GeluGrad)) {
    s += "__device__ __forceinline__ float spmd_gelu_grad(float g, float x) {\n"
         "  const float cdf = 0.5f * (1.0f + erff(x * " + alpha + "));\n"
         "  const float pdf = expf(-0.5f * x * x) * " + beta + ";\n"
         "  return g * (cdf + x * pdf);\n}\n";
  }
  if (geluTanh.count("spmd_gelu_tanh")) {
    s += "__device__ __forceinline__ float spmd_gelu_tanh(float x) {\n"
         "  const float inner = " + tanhBeta + " * (x + " + kappa + " * (x * x * x));\n"
         "  return 0.5f * x * (1.0f + tanhf(inner));\n}\n";
  }
  if (geluTanh.count("spmd_gelu_tanh_grad")) {
    s += "__device__ __forceinline__ float spmd_gelu_tanh_grad(float g, float x) {\n"
         "  const float x_sq = x * x;\n"
         "  const float inner = " + tanhBeta + " * (x + " + kappa + " * (x_sq * x));\n"
         "  const float th = tanhf(inner);\n"
         "  const float left = 0.5f * x, right = 1.0f + th;\n"
         "  const float inner_derivative = " + tanhBeta + " * (1.0f + 3.0f * " + kappa + " * x_sq);\n"
         "  return g * (0.5f * right + left * (1.0f - th * th) * inner_derivative);\n}\n";
  }
  // With 1 + tanh(u) = 2 sigmoid(2u), and 1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u).
  // Where tanh(u) nears -1 ATen's form cancels and this one does not: it
  // is closer to the exact value, and within a 16-bit rounding of ATen's
  // elsewhere. The exponent is clamped where e^-2u would overflow (and
  // sigmoid(2u) is below 1e-38), so that sigmoid(-2u) = e^-2u sigmoid(2u) stays finite.
  const std::string sigmoid2u = "  const float e = __expf(fminf(-2.0f * inner, 88.0f));\n"
                                "  const float s = __fdividef(1.0f, 1.0f + e);\n";
  if (geluTanh.count("spmd_gelu_tanh16")) {
    s += "__device__ __forceinline__ float spmd_gelu_tanh16(float x) {\n"
         "  const float inner = " + tanhBeta + " * (x + " + kappa + " * (x * x * x));\n" + sigmoid2u +
         "  return x * s;\n}\n";
  }
  if (geluTanh.count("spmd_gelu_tanh16_grad")) {
    s += "__device__ __forceinline__ float spmd_gelu_tanh16_grad(float g, float x) {\n"
         "  const float x_sq = x * x;\n"
         "  const float inner = " + tanhBeta + " * (x + " + kappa + " * (x_sq * x));\n" + sigmoid2u +
         "  const float inner_derivative = " + tanhBeta + " * (1.0f + 3.0f * " + kappa + " * x_sq);\n"
         "  return g * (s + 2.0f * x * s * (e * s) * inner_derivative);\n}\n";
  }
  if (ops.count(P::RowMax)) {
    s += "// The larger, or NaN where either is (ATen's max propagates NaN).\n"
         "__device__ __forceinline__ float spmd_max_nan(float a, float b) { return a > b || a != a ? a : b; }\n"
         "__device__ __forceinline__ float spmd_warp_max(float v) {\n"
         "  for (int o = 16; o > 0; o >>= 1) v = spmd_max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
         "  return v;\n}\n";
  }
  if (ops.count(P::RowSum)) {
    s += "__device__ __forceinline__ float spmd_warp_sum(float v) {\n"
         "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
         "  return v;\n}\n";
  }
  if (ops.count(P::Bernoulli)) s += philoxHelpers();
  if (ops.count(P::SiluGrad)) {
    s += "__device__ __forceinline__ float spmd_silu_grad(float g, float x) {\n"
         "  const float s = 1.0f / (1.0f + expf(-x));\n"
         "  return g * s * (1.0f + x * (1.0f - s));\n}\n";
  }
  return s;
}

// Dropout's random words: Philox4x32-10 (Salmon et al., SC'11) with key
// `seed` and counter (c, 0), computed as at::philox_engine computes it, so
// that the CPU reference (fused_kernel_ops.cpp) draws the same masks. A
// bernoulli compares its word with keepBound (bernoulliExpr).
std::string philoxHelpers() {
  return "struct spmd_u32x4 { unsigned int v[4]; };\n"
         "__device__ __forceinline__ spmd_u32x4 spmd_philox(unsigned long long seed, unsigned long long c) {\n"
         "  unsigned int c0 = (unsigned int)c, c1 = (unsigned int)(c >> 32), c2 = 0u, c3 = 0u;\n"
         "  unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);\n"
         "#pragma unroll\n"
         "  for (int round = 0; round < 10; ++round) {\n"
         "    const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;\n"
         "    const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;\n"
         "    c0 = hi1 ^ c1 ^ k0;\n    c1 = lo1;\n    c2 = hi0 ^ c3 ^ k1;\n    c3 = lo0;\n"
         "    k0 += 0x9E3779B9u;\n    k1 += 0xBB67AE85u;\n"
         "  }\n"
         "  spmd_u32x4 words = {{c0, c1, c2, c3}};\n"
         "  return words;\n}\n";
}

}  // namespace spmd
