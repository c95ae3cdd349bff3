#include "spmd/support/write_all.h"

#include <unistd.h>

#include <cerrno>

namespace spmd {

namespace {

// Large buffers go in pieces of this size: a write(2) of hundreds of
// megabytes from pages not yet mapped (a tensor over a mapped file) makes
// the kernel's copy fault and retry page by page; measured on the 2-core CI
// machine, 650 MB from a mapped file took 1.6 s in one call, 0.4 s in 1 MiB pieces.
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
