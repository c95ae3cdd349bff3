// The compiling stages, in their order: spmd-expand, spmd-split,
// spmd-unroll, spmd-lower (spmd-compile runs them in one process).
#pragma once

#include <string>

namespace spmd {

enum class Stage { Expand, Split, Unroll, Lower };

// "expand", "split", "unroll", "lower".
const char* stageName(Stage stage);
// The stage of that name; false when there is none.
bool parseStage(const std::string& name, Stage& stage);

}  // namespace spmd
