#include "spmd/ops/cuda_emitter.h"

namespace spmd {

std::string bfloat16Helpers() {
  return "__device__ __forceinline__ float spmd_bf16_to_f32(unsigned short h) {\n"
         "  return __uint_as_float(((unsigned int)h) << 16);\n}\n"
         "// Round to nearest even. From sm_80 one instruction, as ATen's CUDA kernels round there\n"
         "// (a NaN becomes 0x7fff); before it c10::BFloat16's integer rounding (a NaN becomes 0x7fc0).\n"
         "__device__ __forceinline__ unsigned short spmd_f32_to_bf16(float f) {\n"
         "#if __CUDA_ARCH__ >= 800\n"
         "  unsigned short h;\n  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;\n"
         "#else\n"
         "  unsigned int u = __float_as_uint(f);\n"
         "  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;\n"
         "  u += 0x7fffu + ((u >> 16) & 1u);\n"
         "  return (unsigned short)(u >> 16);\n"
         "#endif\n}\n";
}

std::string float16Helpers() {
  return "__device__ __forceinline__ float spmd_f16_to_f32(unsigned short h) {\n"
         "  float f;\n  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n  return f;\n}\n"
         "__device__ __forceinline__ unsigned short spmd_f32_to_f16(float f) {\n"
         "  unsigned short h;\n  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;\n}\n";
}

}  // namespace spmd
