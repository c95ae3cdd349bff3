// What every generated kernel's spec shares (one spec type per kernel
// family: PointwiseKernelSpec in ops/cuda_codegen.h, LayerNormKernelSpec and
// LayerNormBackwardKernelSpec in ops/layer_norm_codegen.h,
// CrossEntropyKernelSpec and CrossEntropyWithGradKernelSpec in
// ops/cross_entropy_codegen.h, ColumnSumKernelSpec in
// ops/column_sum_codegen.h, AttentionSoftmaxKernelSpec in
// ops/attention_codegen.h). A spec holds exactly the attributes that make a
// kernel's CUDA source: its key() names them in a short deterministic
// string, so that two specs of equal keys have the same source (the kernel
// cache is keyed by it), and source() is generated on its first call only.
// Each spec also says how its kernels are launched (KernelLaunch) for the
// run-time sizes. spmd-inspect --kernels and spmd-lower (analysis/kernels.h)
// make specs from graph nodes, the CUDA ops from tensors, both through the
// spec's forCall(KernelCallArgs), so which arguments of an op make its
// source is written once.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spmd {

// One launch of one kernel of a spec's source: `blocks` blocks of `threads`
// threads with `sharedBytes` of dynamic shared memory; its arguments are the
// caller's data pointers, then `count` (the rows or parts it covers) where
// the kernel takes one (the pointwise kernels take none).
struct KernelLaunch {
  const char* kernel = nullptr;  // its name in the source
  int64_t blocks = 0;
  int threads = 0;
  int sharedBytes = 0;
  std::optional<long long> count;
};

// The arguments of one call of an op as a kernel spec reads them, by their
// place in the op's schema (ops/spmd_ops.h): a tensor's dtype and shape, or
// a scalar. analysis/kernels.cpp gives a graph node's, the CUDA ops the
// tensors and scalars they were called with (ops/ivalue_call_args.h).
class KernelCallArgs {
 public:
  virtual ~KernelCallArgs() = default;
  virtual bool given(size_t arg) const = 0;  // a tensor, not None
  virtual c10::ScalarType dtype(size_t arg) const = 0;
  virtual std::vector<int64_t> shape(size_t arg) const = 0;
  virtual double real(size_t arg) const = 0;
  virtual int64_t integer(size_t arg) const = 0;  // a dtype argument's code too
  virtual bool flag(size_t arg) const = 0;
};

// The part every spec shares: its key, and its source generated once.
// Neither copies nor moves are shared with other threads: a spec is made
// and read by one caller.
class KernelSpec {
 public:
  virtual ~KernelSpec() = default;
  const std::string& key() const { return key_; }
  // The CUDA C; throws std::invalid_argument where the attributes do not
  // make a kernel (as the constructors do for most such attributes).
  const std::string& source() const;

 protected:
  explicit KernelSpec(std::string key) : key_(std::move(key)) {}
  virtual std::string generateSource() const = 0;

 private:
  std::string key_;
  mutable std::optional<std::string> source_;
};

// A generated kernel's source and its compiled code for one architecture:
// what spmd-lower stores in the artifact (backend/generated_kernels.h
// compiles and installs them).
struct CompiledKernel {
  std::string source;
  std::string arch;   // "sm_90"
  std::string image;  // the cubin, as NVRTC returned it
};

}  // namespace spmd
