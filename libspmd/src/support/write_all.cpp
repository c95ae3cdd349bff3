#include "spmd/support/write_all.h"

#include <unistd.h>

#include <cerrno>

namespace spmd {

namespace {

// Large buffers go in pieces of this size: on the 2-core CI machine, dd
// copied a 650 MB file in 1.63 s with 64 MiB writes and in 0.18 s with
// 128 KiB ones, and a program writing it from a mapping in 1 MiB pieces took
// 0.43 s. (spmd-lower's artifact writing did not get measurably faster.)
constexpr size_t kPiece = size_t{1} << 20;

}  // namespace

bool writeAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size < kPiece ? size : kPiece);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace spmd
