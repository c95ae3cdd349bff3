// Echoing user input in one-line messages: bad values can be huge (a 50 MB
// string) or hold newlines, and an error line must stay one short line.
#pragma once

#include <cstddef>
#include <string>

namespace spmd {

// How many characters of a user's value a message repeats.
constexpr size_t kEchoLimit = 60;

// `text` for a message, valid UTF-8 on one line: control characters and
// bytes that are not UTF-8 escaped (`\n`, `\x01`, `\xff`), and cut to its
// first `limit` bytes (never inside a character) followed by "..." when longer.
std::string echo(const std::string& text, size_t limit = kEchoLimit);

// A whole error line made safe to print, as echo() makes a value, cut at
// `limit` bytes (a last guard; messages cut their values first).
std::string oneLine(const std::string& text, size_t limit = 8192);

}  // namespace spmd
