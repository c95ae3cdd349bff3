// Writing a whole buffer to a file descriptor: write(2) may write less than
// asked, or be interrupted by a signal.
#pragma once

#include <cstddef>

namespace spmd {

// True when all `size` bytes were written; false (errno set, or 0 for a
// write that wrote nothing) otherwise. Async-signal-safe.
bool writeAll(int fd, const void* data, size_t size);

}  // namespace spmd
