// The storages a torch.save or torch.jit.save pickle names by persistent id:
// the archive's data/<key> records, copied out of the zip, or views of the
// file when it is mapped.
#include "torch_save_internal.h"
#include "spmd/io/torch_save.h"

#include "spmd/support/limits.h"
#include "spmd/support/mapped_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstring>

namespace spmd {
namespace torch_save_detail {
namespace {

void checkSize(const std::string& record, size_t size, at::ScalarType dtype, int64_t numel) {
  const size_t expected = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (size != expected) {
    throw DamagedRecord("", "storage record '" + record + "' has " + std::to_string(size) + " bytes, expected " +
                                std::to_string(expected));
  }
}

}  // namespace

Storages::Storages(caffe2::serialize::PyTorchStreamReader& reader, const UnpickleOptions& options)
    : reader_(reader), mapping_(options.mapping) {
  if (!mapping_) return;
  const std::string_view archive = mapping_->view().substr(options.archiveOffset, options.archiveSize ? options.archiveSize : std::string_view::npos);
  for (ZipMember& m : zipMembers(archive)) {
    m.offset += options.archiveOffset;
    const size_t slash = m.name.find('/');
    if (slash != std::string::npos) members_.emplace(m.name.substr(slash + 1), std::move(m));
  }
}

at::Tensor Storages::get(const std::string& key, at::ScalarType dtype, int64_t numel) {
  auto it = loaded_.find(key);
  if (it != loaded_.end()) {
    if (it->second.scalar_type() != dtype) fail("storage '" + key + "' is saved with two dtypes");
    return it->second;
  }
  if (numel < 0 || numel > kMaxTensorElements) {
    fail("storage '" + key + "' of " + std::to_string(numel) + " elements (at most 2^48)");
  }
  at::Tensor storage = mapping_ ? view(key, dtype, numel) : read(key, dtype, numel);
  loaded_.emplace(key, storage);
  return storage;
}

at::Tensor Storages::read(const std::string& key, at::ScalarType dtype, int64_t numel) {
  const std::string record = "data/" + key;
  if (!reader_.hasRecord(record)) throw DamagedRecord("", "missing storage record '" + record + "'");
  at::DataPtr data;
  size_t size = 0;
  std::tie(data, size) = reader_.getRecord(record);
  checkSize(record, size, dtype, numel);
  at::Tensor storage = at::empty({numel}, at::TensorOptions().dtype(dtype));
  if (size > 0) std::memcpy(storage.data_ptr(), data.get(), size);
  return storage;
}

// The storage's bytes in the mapped file, without a copy: copy-on-write, so
// that a tensor written to never changes the file.
at::Tensor Storages::view(const std::string& key, at::ScalarType dtype, int64_t numel) {
  const std::string record = "data/" + key;
  auto it = members_.find(record);
  if (it == members_.end()) throw DamagedRecord("", "missing storage record '" + record + "'");
  const ZipMember& m = it->second;
  if (m.compressed) fail("storage record '" + record + "' is compressed");
  checkSize(record, m.size, dtype, numel);
  char* data = mapping_->writableBytes() + m.offset;
  if (numel == 0 || reinterpret_cast<uintptr_t>(data) % c10::elementSize(dtype) != 0) return read(key, dtype, numel);
  std::shared_ptr<MappedFile> keep = mapping_;
  return at::from_blob(data, {numel}, [keep](void*) {}, at::TensorOptions().dtype(dtype));
}

}  // namespace torch_save_detail
}  // namespace spmd
