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

// Names of layouts and memory formats as torch prints them ("strided",
// "channels_last"); the number itself for one torch has no name for.
std::string layoutName(int64_t layout);
std::string memoryFormatName(int64_t format);
// The c10::Layout or c10::MemoryFormat a name stands for.
std::optional<int64_t> parseLayout(const std::string& name);
std::optional<int64_t> parseMemoryFormat(const std::string& name);

}  // namespace spmd
