// The members of a zip file mapped in memory, read from its central
// directory (zip64 included): where each member's bytes are, so that a
// reader can take a view of them instead of a copy (numpy.savez's .npz,
// torch.save's storages).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

class MappedFile;

struct ZipMember {
  std::string name;
  size_t offset = 0;  // of the member's data in the file
  size_t size = 0;        // of its data, uncompressed
  size_t storedSize = 0;  // of its bytes in the file (size, unless compressed)
  bool compressed = false;
};

// Throws Diagnostic (where "", naming no file) when `file` is not a zip file
// or a member lies outside it.
std::vector<ZipMember> zipMembers(const MappedFile& file);
std::vector<ZipMember> zipMembers(std::string_view zip);

}  // namespace spmd
