// The files spmd-run --data and --tokens read: tensors by input name from a
// torch.save'd dict, an uncompressed .npz (numpy.savez) or a folder of .npy
// files, and nanoGPT's token streams (train.bin). NumPy files and token
// streams are memory-mapped, never read whole: a step touches only the pages
// of its own rows, so host memory stays flat as the files grow.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace spmd {

// The tensors of a --data path by name: a folder of NAME.npy files, a .npz
// file, or a torch.save file. NumPy arrays are CPU tensors over a private
// (copy-on-write) mapping of the file. Throws Diagnostic naming the file
// for anything it cannot read: compressed .npz members (numpy.savez_compressed),
// Fortran order, byte orders or dtypes torch has no tensor type for.
std::map<std::string, at::Tensor> openDataTensors(const std::string& path);

// A token file: a flat array of uint16 or uint32 token ids (nanoGPT's
// train.bin), memory-mapped.
class TokenFile {
 public:
  // `dtype`: "uint16" or "uint32". Throws Diagnostic naming the file.
  TokenFile(const std::string& path, const std::string& dtype);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }
  // `rows` windows of `length` tokens starting at `starts[i]` and
  // `starts[i] + shift`, as int64 [rows, length].
  at::Tensor windows(const std::vector<int64_t>& starts, int64_t length, int64_t shift) const;

 private:
  std::string path_;
  int width_ = 2;  // bytes per token
  int64_t count_ = 0;
  void* map_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace spmd
