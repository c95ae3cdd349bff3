// Parsing JSON that users hand us, with bounds: nlohmann's parser accepts
// any nesting, and later recursive walks of a value (dump() in an error
// message, comparisons) overflow the stack on ~60k levels; a 50 MB string
// would be echoed whole. The limits are README's ("Input bounds").
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace spmd {

constexpr int kMaxJsonDepth = 64;               // nested arrays and objects
constexpr size_t kMaxJsonString = size_t{1} << 20;  // characters of one string (as written)

// Parses `text`. Bad JSON, nesting deeper than kMaxJsonDepth, a string longer
// than kMaxJsonString and a number outside double's range are a Diagnostic
// "invalid JSON: ... at line L, column C" (where is empty: the caller names
// the file, and the record inside it if any).
nlohmann::json parseJson(const std::string& text);

// A JSON value as a message shows it: scalars as JSON, cut to a short prefix;
// arrays and objects by their type only (never dumped whole).
std::string briefJson(const nlohmann::json& j);

}  // namespace spmd
