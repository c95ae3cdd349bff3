// The members of a zip file mapped in memory, read from its central
// directory (zip64 included): where each member's bytes are, so that a
// reader can take a view of them instead of a copy (numpy.savez's .npz,
// torch.save's storages).
#pragma once

#include <cstddef>
#include <cstdint>
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
  uint16_t method = 0;    // 0: stored, 8: deflated
  uint32_t crc32 = 0;     // of its uncompressed data, as the central directory records it
};

// Throws Diagnostic (where "", naming no file) when `file` is not a zip file
// or a member lies outside it.
std::vector<ZipMember> zipMembers(const MappedFile& file);
std::vector<ZipMember> zipMembers(std::string_view zip);

// Which stored members checkZipStructure compares with their CRC-32.
enum class ZipCrc {
  All,            // every one: files whose every byte matters (checkpoints, weights, data)
  UpTo1MiB,       // the small ones (code, pickles, debug info), which LibTorch parses
};

// Throws Diagnostic (where "") unless `zip` is a whole zip file: its end
// record, central directory and every member's local header and bytes
// inside it, the stored members `crc` names equal to their CRC-32. Run
// before LibTorch's zip reader sees a file, which trusts offsets and reads
// out of bounds on a cut one, and parses damaged members slowly or not at all.
void checkZipStructure(std::string_view zip, ZipCrc crc);

}  // namespace spmd
