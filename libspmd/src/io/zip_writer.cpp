#include "spmd/io/zip_writer.h"

#include <caffe2/serialize/versions.h>
#include <zlib.h>

#include <algorithm>
#include <future>

namespace spmd {
namespace {

constexpr uint64_t kAlignment = 64;             // of each member's data, as PyTorch aligns it
constexpr size_t kPiece = size_t{1} << 20;       // read, CRC-32'd and written while in cache
constexpr uint16_t kFlags = 0x0808;              // sizes and CRC after the data; UTF-8 names
constexpr uint16_t kPaddingField = 0x4246;       // the extra field PyTorch pads with ("FB")
constexpr uint16_t kZip64Field = 0x0001;
constexpr uint64_t kMax32 = 0xffffffff;
// Members from this size on have their CRC-32 computed on a thread of its
// own while they are written (see add()).
constexpr size_t kParallelCrc = size_t{8} << 20;

// A header under construction, little-endian.
class Bytes {
 public:
  Bytes& u16(uint64_t v) { return le(v, 2); }
  Bytes& u32(uint64_t v) { return le(v, 4); }
  Bytes& u64(uint64_t v) { return le(v, 8); }
  Bytes& text(const std::string& s) {
    out_ += s;
    return *this;
  }
  Bytes& zeros(size_t n) {
    out_.append(n, '\0');
    return *this;
  }
  const std::string& str() const { return out_; }

 private:
  Bytes& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i, v >>= 8) out_.push_back(static_cast<char>(v & 0xff));
    return *this;
  }
  std::string out_;
};

uint16_t versionNeeded(bool zip64) { return zip64 ? 45 : 20; }

uint32_t crcOf(const unsigned char* bytes, size_t size) {
  uLong crc = crc32_z(0, nullptr, 0);
  for (size_t at = 0; at < size; at += kPiece) crc = crc32_z(crc, bytes + at, std::min(kPiece, size - at));
  return static_cast<uint32_t>(crc);
}

}  // namespace

ZipWriter::ZipWriter(std::function<void(const void*, size_t)> sink, bool alwaysZip64)
    : sink_(std::move(sink)), alwaysZip64_(alwaysZip64) {}

void ZipWriter::put(const void* data, size_t size) {
  if (size == 0) return;
  sink_(data, size);
  written_ += size;
}

bool ZipWriter::zip64(uint64_t value) const { return alwaysZip64_ || value >= kMax32; }

void ZipWriter::add(const std::string& name, const void* data, size_t size, const PieceObserver& eachPiece) {
  Entry entry{"archive/" + name, written_, size, 0};
  const bool large = zip64(size);
  // The local header's CRC and sizes are zero (flag bit 3): they follow the
  // data. A member of 4 GiB or more says so with a zip64 field, and its
  // descriptor's sizes are 8 bytes.
  const uint64_t beforePadding = written_ + 30 + entry.name.size() + (large ? 20 : 0) + 4;
  const uint64_t padding = (kAlignment - beforePadding % kAlignment) % kAlignment;
  Bytes header;
  header.u32(0x04034b50).u16(versionNeeded(large)).u16(kFlags).u16(0).u16(0).u16(0);
  header.u32(0).u32(0).u32(0).u16(entry.name.size()).u16((large ? 20 : 0) + 4 + padding).text(entry.name);
  if (large) header.u16(kZip64Field).u16(16).u64(0).u64(0);
  header.u16(kPaddingField).u16(padding).zeros(padding);
  put(header.str().data(), header.str().size());

  // A large member's CRC-32 runs on another thread while this one writes
  // it: zlib's CRC (about 2 GB/s on a 2-core CI machine) took as long as
  // the write and the observer's checksum together, a third of writing a
  // 500 MB artifact. A small one's is summed piece by piece, in cache.
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::future<uint32_t> parallelCrc;
  if (size >= kParallelCrc) parallelCrc = std::async(std::launch::async, crcOf, bytes, size);
  uLong crc = crc32_z(0, nullptr, 0);
  for (size_t at = 0; at < size; at += kPiece) {
    const size_t n = std::min(kPiece, size - at);
    if (eachPiece) eachPiece(bytes + at, n);
    if (!parallelCrc.valid()) crc = crc32_z(crc, bytes + at, n);
    put(bytes + at, n);
  }
  entry.crc = parallelCrc.valid() ? parallelCrc.get() : static_cast<uint32_t>(crc);

  Bytes descriptor;
  descriptor.u32(0x08074b50).u32(entry.crc);
  if (large) {
    descriptor.u64(size).u64(size);
  } else {
    descriptor.u32(size).u32(size);
  }
  put(descriptor.str().data(), descriptor.str().size());
  entries_.push_back(std::move(entry));
}

void ZipWriter::writeCentralDirectory() {
  for (const Entry& e : entries_) {
    const bool bigSize = zip64(e.size), bigOffset = zip64(e.offset);
    // The zip64 field holds the values that do not fit, in this order:
    // uncompressed size, compressed size, offset.
    Bytes extra;
    if (bigSize) extra.u64(e.size).u64(e.size);
    if (bigOffset) extra.u64(e.offset);
    const size_t extraLength = extra.str().empty() ? 0 : 4 + extra.str().size();
    Bytes record;
    record.u32(0x02014b50).u16(versionNeeded(extraLength > 0)).u16(versionNeeded(extraLength > 0));
    record.u16(kFlags).u16(0).u16(0).u16(0).u32(e.crc);
    record.u32(bigSize ? kMax32 : e.size).u32(bigSize ? kMax32 : e.size);
    record.u16(e.name.size()).u16(extraLength).u16(0).u16(0).u16(0).u32(0);
    record.u32(bigOffset ? kMax32 : e.offset).text(e.name);
    if (extraLength > 0) record.u16(kZip64Field).u16(extra.str().size()).text(extra.str());
    put(record.str().data(), record.str().size());
  }
}

void ZipWriter::finish() {
  const std::string version = std::to_string(caffe2::serialize::kMinProducedFileFormatVersion) + "\n";
  add("version", version.data(), version.size());
  const uint64_t directory = written_;
  writeCentralDirectory();
  const uint64_t directorySize = written_ - directory;
  const uint64_t count = entries_.size();
  const bool large = alwaysZip64_ || count >= 0xffff || zip64(directory) || zip64(directorySize);
  Bytes end;
  if (large) {
    const uint64_t record = written_;
    end.u32(0x06064b50).u64(44).u16(45).u16(45).u32(0).u32(0).u64(count).u64(count);
    end.u64(directorySize).u64(directory);
    end.u32(0x07064b50).u32(0).u64(record).u32(1);
  }
  end.u32(0x06054b50).u16(0).u16(0).u16(large ? 0xffff : count).u16(large ? 0xffff : count);
  end.u32(large ? kMax32 : directorySize).u32(large ? kMax32 : directory).u16(0);
  put(end.str().data(), end.str().size());
}

}  // namespace spmd
