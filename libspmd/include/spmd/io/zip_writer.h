// A zip file written as a stream, in the layout PyTorch's stream format
// uses (every member stored, not compressed, under "archive/", its data
// 64-byte aligned, an "archive/version" record), so LibTorch's
// PyTorchStreamReader, Python's zipfile and zip_members.h read it.
//
// PyTorchStreamWriter writes the same layout but computes each member's
// CRC-32 a byte at a time: 1.5 s of spmd-lower's 2.6 s for a 652 MB model on
// the 2-core CI machine. Here zlib computes it: for a small member a piece
// at a time while the piece is written (the data read once, in cache), for
// a large one on a thread of its own beside the write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace spmd {

class ZipWriter {
 public:
  // `sink` writes all it is given or throws. `alwaysZip64` writes the zip64
  // fields even where sizes and offsets fit 32 bits: for tests, which cannot
  // write 4 GiB.
  explicit ZipWriter(std::function<void(const void*, size_t)> sink, bool alwaysZip64 = false);

  // Adds "archive/<name>". `eachPiece`, when given, sees the data in the
  // pieces written, each 1 MiB but the last, before it is written.
  using PieceObserver = std::function<void(const void*, size_t)>;
  void add(const std::string& name, const void* data, size_t size, const PieceObserver& eachPiece = nullptr);
  // The version record, the central directory and its end. Nothing may be
  // added after.
  void finish();

 private:
  struct Entry {
    std::string name;
    uint64_t offset, size;
    uint32_t crc;
  };
  void put(const void* data, size_t size);
  bool zip64(uint64_t value) const;
  void writeCentralDirectory();

  std::function<void(const void*, size_t)> sink_;
  bool alwaysZip64_;
  uint64_t written_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace spmd
