// Names of dtypes as torch spells them (float32, bfloat16, int64) and their
// short forms (f32, bf16, i64).
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace spmd {

// The canonical torch name: "float32".
std::string dtypeName(c10::ScalarType t);
// The short form used in listings: "f32".
std::string dtypeShortName(c10::ScalarType t);
// Accepts both forms and torch's aliases (float, half, long, ...).
std::optional<c10::ScalarType> parseDtype(const std::string& name);

}  // namespace spmd
