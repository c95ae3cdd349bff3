#include "spmd/io/zip_members.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"
#include "spmd/support/little_endian.h"
#include "spmd/support/mapped_file.h"

#include <cstdint>
#include <optional>
#include <vector>

#include <zlib.h>

namespace spmd {
namespace {

[[noreturn]] void notAZip() { throw Diagnostic("", "not a zip file, or a damaged one"); }

// The end of central directory record: in the last 64 KiB + 22 bytes.
size_t endOfDirectory(const char* z, size_t n) {
  if (n < 22) notAZip();
  for (size_t i = n - 22;; --i) {
    if (littleEndian(z + i, 4) == 0x06054b50) return i;
    if (i == 0 || i + 65557 < n) notAZip();
  }
}

}  // namespace

std::vector<ZipMember> zipMembers(const MappedFile& file) { return zipMembers(file.view()); }

std::vector<ZipMember> zipMembers(std::string_view zip) {
  const char* z = zip.data();
  const size_t n = zip.size();
  const size_t eocd = endOfDirectory(z, n);
  uint64_t entries = littleEndian(z + eocd + 10, 2), directory = littleEndian(z + eocd + 16, 4);
  if ((entries == 0xffff || directory == 0xffffffff) && eocd >= 20 && littleEndian(z + eocd - 20, 4) == 0x07064b50) {
    const uint64_t zip64 = littleEndian(z + eocd - 12, 8);
    if (zip64 > n || n - zip64 < 56 || littleEndian(z + zip64, 4) != 0x06064b50) notAZip();
    entries = littleEndian(z + zip64 + 32, 8);
    directory = littleEndian(z + zip64 + 48, 8);
  }
  std::vector<ZipMember> members;
  uint64_t at = directory;
  for (uint64_t e = 0; e < entries; ++e) {
    if (at > n || n - at < 46 || littleEndian(z + at, 4) != 0x02014b50) notAZip();
    ZipMember m;
    const uint64_t method = littleEndian(z + at + 10, 2), nameLength = littleEndian(z + at + 28, 2),
                   extraLength = littleEndian(z + at + 30, 2), commentLength = littleEndian(z + at + 32, 2);
    m.crc32 = static_cast<uint32_t>(littleEndian(z + at + 16, 4));
    uint64_t stored = littleEndian(z + at + 20, 4), size = littleEndian(z + at + 24, 4),
             local = littleEndian(z + at + 42, 4);
    if (n - at - 46 < nameLength + extraLength) notAZip();
    m.name.assign(z + at + 46, nameLength);
    m.compressed = method != 0;
    m.method = static_cast<uint16_t>(method);
    // zip64 sizes and offset: in the extra field 0x0001, those that overflowed, in this order.
    const uint64_t extraEnd = at + 46 + nameLength + extraLength;
    for (uint64_t x = at + 46 + nameLength; x + 4 <= extraEnd;) {
      const uint64_t id = littleEndian(z + x, 2), length = littleEndian(z + x + 2, 2);
      uint64_t field = x + 4;
      const auto next8 = [&] {
        if (field + 8 > extraEnd) notAZip();
        const uint64_t v = littleEndian(z + field, 8);
        field += 8;
        return v;
      };
      if (id == 1) {
        if (size == 0xffffffff) size = next8();
        if (stored == 0xffffffff) stored = next8();
        if (local == 0xffffffff) local = next8();
      }
      x += 4 + length;
    }
    if (local > n || n - local < 30 || littleEndian(z + local, 4) != 0x04034b50) notAZip();
    m.offset = local + 30 + littleEndian(z + local + 26, 2) + littleEndian(z + local + 28, 2);
    m.size = size;
    m.storedSize = stored;
    if (m.offset > n || m.storedSize > n - m.offset || (!m.compressed && m.size != m.storedSize)) notAZip();
    members.push_back(m);
    at += 46 + nameLength + extraLength + commentLength;
  }
  return members;
}

namespace {

// The CRC-32 of a deflated member's data, inflated a piece at a time;
// nullopt when it does not inflate to its recorded size.
std::optional<uint32_t> inflatedCrc(std::string_view zip, const ZipMember& m) {
  z_stream in{};
  if (inflateInit2(&in, -MAX_WBITS) != Z_OK) return std::nullopt;  // raw deflate, as zip stores it
  in.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(zip.data() + m.offset));
  in.avail_in = static_cast<uInt>(m.storedSize);  // members past 4 GiB are never deflated by torch.save
  std::vector<Bytef> piece(size_t{1} << 16);
  uLong sum = crc32_z(0, nullptr, 0);
  size_t total = 0;
  int status = Z_OK;
  while (status == Z_OK && total <= m.size) {
    in.next_out = piece.data();
    in.avail_out = static_cast<uInt>(piece.size());
    status = inflate(&in, Z_NO_FLUSH);
    const size_t got = piece.size() - in.avail_out;
    sum = crc32_z(sum, piece.data(), got);
    total += got;
    if (status == Z_OK && got == 0 && in.avail_in == 0) break;  // truncated
  }
  inflateEnd(&in);
  if (status != Z_STREAM_END || total != m.size) return std::nullopt;
  return static_cast<uint32_t>(sum);
}

std::optional<uint32_t> crcOf(std::string_view zip, const ZipMember& m) {
  if (m.method == 8) return inflatedCrc(zip, m);
  return static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(zip.data() + m.offset), m.size));
}

}  // namespace

void checkZipStructure(std::string_view zip, ZipCrc crc) {
  constexpr size_t kSmall = size_t{1} << 20;
  for (const ZipMember& m : zipMembers(zip)) {
    const std::string name = "member '" + echo(m.name, 200) + "'";
    if (m.method != 0 && m.method != 8) {
      throw Diagnostic("", "damaged zip file: " + name + " is compressed with method " + std::to_string(m.method) +
                               " (only stored and deflated members are read)");
    }
    if (crc == ZipCrc::UpTo1MiB && m.size > kSmall) continue;
    if (crcOf(zip, m) != m.crc32) throw Diagnostic("", "damaged zip file: " + name + " does not match its CRC-32");
  }
}

}  // namespace spmd
