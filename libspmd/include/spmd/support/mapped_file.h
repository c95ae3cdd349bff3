// A whole file mapped into memory: inputs are read through the page cache
// instead of being copied into the heap, and tensors over a mapping (data
// files, an artifact's weights) keep it alive while they live.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace spmd {

class MappedFile {
 public:
  enum class Access {
    ReadOnly,     // writes fault: for data nobody may change
    CopyOnWrite,  // writes go to private pages; the file never changes
  };
  // Throws Diagnostic naming `path` when it cannot be opened, is not a
  // regular file, or cannot be mapped.
  explicit MappedFile(const std::string& path, Access access = Access::ReadOnly);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps every page now, in one call, for a caller about to read all of it:
  // page by page, each first read is a fault, and on the 2-core CI VM those
  // faults cost spmd-lower more than copying its 652 MB of weights. Does
  // nothing on kernels before 5.14, where reads fault as before.
  void prefault() const;

  const char* bytes() const { return static_cast<const char*>(data_); }
  char* writableBytes() const { return static_cast<char*>(data_); }  // CopyOnWrite only
  size_t size() const { return size_; }
  std::string_view view() const { return {bytes(), size_}; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace spmd
