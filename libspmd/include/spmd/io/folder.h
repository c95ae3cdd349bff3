// An output folder a tool writes its files into (spmd-compile --stage-dir,
// spmd-train --dir).
#pragma once

#include <string>

namespace spmd {

// `dir`, made when missing (its parent must exist); throws Diagnostic naming
// `flag` when it cannot be.
void makeFolder(const std::string& dir, const std::string& flag);

}  // namespace spmd
