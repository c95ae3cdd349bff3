// KernelCallArgs (ops/kernel_spec.h) over the arguments a CUDA op's
// implementation was called with, in schema order, as IValues: how the CUDA
// ops make their kernels' specs by the same rule as analysis/kernels.cpp.
#pragma once

#include "spmd/ops/kernel_spec.h"

#include <ATen/core/ivalue.h>

#include <utility>
#include <vector>

namespace spmd {

class IValueCallArgs final : public KernelCallArgs {
 public:
  explicit IValueCallArgs(std::vector<c10::IValue> args) : args_(std::move(args)) {}
  bool given(size_t arg) const override { return args_.at(arg).isTensor() && args_[arg].toTensor().defined(); }
  c10::ScalarType dtype(size_t arg) const override { return args_.at(arg).toTensor().scalar_type(); }
  std::vector<int64_t> shape(size_t arg) const override { return args_.at(arg).toTensor().sizes().vec(); }
  double real(size_t arg) const override { return args_.at(arg).toDouble(); }
  int64_t integer(size_t arg) const override {
    const c10::IValue& v = args_.at(arg);
    return v.isInt() ? v.toInt() : static_cast<int64_t>(v.toScalarType());
  }
  bool flag(size_t arg) const override { return args_.at(arg).toBool(); }

 private:
  std::vector<c10::IValue> args_;
};

}  // namespace spmd
