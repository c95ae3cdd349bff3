// Small text helpers every layer uses.
#pragma once

#include <string>
#include <string_view>

namespace spmd {

inline bool startsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
inline bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Shortest text that reads back as the same double ("0.1", "1e-05", "-inf").
std::string floatText(double f);

}  // namespace spmd
