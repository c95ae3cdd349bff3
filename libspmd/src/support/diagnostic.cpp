#include "spmd/support/diagnostic.h"

namespace spmd {

namespace {

// "12:7": a position in a text file, joined to the file name as compilers do.
bool isLineColumn(const std::string& where) {
  size_t colon = where.find(':');
  if (colon == 0 || colon == std::string::npos || colon + 1 == where.size()) return false;
  for (size_t i = 0; i < where.size(); ++i) {
    if (i != colon && (where[i] < '0' || where[i] > '9')) return false;
  }
  return true;
}

}  // namespace

std::string Diagnostic::format() const {
  std::string out;
  if (!file_.empty()) out += file_ + (isLineColumn(where_) ? ":" : ": ");
  if (!where_.empty()) out += where_ + ": ";
  return out + what_;
}

void DiagnosticEngine::note(std::string where, std::string what) {
  Diagnostic note(std::move(where), std::move(what));
  note.inFile(file_);
  if (handler_) {
    handler_(note);
  } else {
    notes_.push_back(std::move(note));
  }
}

}  // namespace spmd
