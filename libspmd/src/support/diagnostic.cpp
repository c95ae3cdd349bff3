#include "spmd/support/diagnostic.h"

namespace spmd {

std::string Diagnostic::format() const {
  std::string out;
  if (!file_.empty()) out += file_ + ": ";
  if (!where_.empty()) out += where_ + ": ";
  return out + what_;
}

}  // namespace spmd
