#include "spmd/ops/kernel_spec.h"

namespace spmd {

const std::string& KernelSpec::source() const {
  if (!source_) source_ = generateSource();
  return *source_;
}

}  // namespace spmd
