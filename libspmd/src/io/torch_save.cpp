// torch.save files (the default zip format), read without torch::pickle_load
// and written without torch::pickle_save.
//
// Why this exists: torch::pickle_load copies every storage into memory,
// where spmd maps its weights and data files and hands out views of them
// (pickle_storages.cpp), and it must refuse malformed files with a one-line
// Diagnostic (fuzzed: tests/fuzz). This
// is a small pickle machine of our own for what torch.save writes (pickle
// protocol 2, plus the cheap opcodes of protocols 3-5). The zip container is
// read with LibTorch's PyTorchStreamReader:
// <archive>/data.pkl is the pickle, and <archive>/data/<key> holds the raw
// little-endian bytes of each storage the pickle names by persistent id.
//
// Writing: torch::pickle_save's output names torch.jit._pickle globals, which
// torch.load(weights_only=True), the default since PyTorch 2.6, rejects. So
// saveTorchSave pickles a {name: tensor} dict the way Python's torch.save
// does, opcode for opcode, with only the globals weights_only allows.
//
// This file holds the zip archive, read and written, and the entry points;
// pickle_read.cpp and pickle_write.cpp hold the pickle machines.
#include "spmd/io/torch_save.h"

#include "spmd/io/load.h"
#include "spmd/io/zip_members.h"
#include "spmd/io/zip_writer.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/mapped_file.h"
#include "torch_save_internal.h"

#include <ATen/core/Tensor.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

namespace spmd {
namespace {

using caffe2::serialize::PyTorchStreamReader;
using caffe2::serialize::ReadAdapterInterface;
namespace op = torch_save_detail::op;
using torch_save_detail::fail;
using torch_save_detail::firstLine;
using torch_save_detail::pickleTensorDict;
using torch_save_detail::prepare;
using torch_save_detail::unpickle;

// ---- the archive ---------------------------------------------------------------

// torch.save's legacy format (_use_new_zipfile_serialization=False) is a bare
// pickle stream, not a zip file.
void rejectLegacy(char firstByte) {
  if (static_cast<uint8_t>(firstByte) == op::PROTO) {
    fail("not a zip file: this is torch.save's legacy format (_use_new_zipfile_serialization=False); "
         "save it again with torch.save's default format");
  }
}

c10::IValue readArchive(std::shared_ptr<ReadAdapterInterface> in,
                        const torch_save_detail::UnpickleOptions& options = {}) {
  std::unique_ptr<PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<PyTorchStreamReader>(std::move(in));
  } catch (const c10::Error& e) {
    fail("not a torch.save zip file: " + firstLine(e));
  }
  if (!reader->hasRecord("data.pkl")) fail("not a torch.save file: the archive has no data.pkl");
  if (reader->hasRecord("byteorder")) {
    at::DataPtr order;
    size_t size = 0;
    std::tie(order, size) = reader->getRecord("byteorder");
    if (std::string(static_cast<const char*>(order.get()), size) != "little") {
      fail("big-endian torch.save files are not supported");
    }
  }
  at::DataPtr data;
  size_t size = 0;
  std::tie(data, size) = reader->getRecord("data.pkl");
  const std::string pickle(static_cast<const char*>(data.get()), size);
  return unpickle(pickle, *reader, options);
}

}  // namespace

c10::IValue loadTorchSaveBytes(const std::string& bytes) {
  try {
    if (!bytes.empty()) rejectLegacy(bytes[0]);
    checkZipStructure(bytes, ZipCrc::All);
    return readArchive(std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
  } catch (const Diagnostic&) {
    throw;
  } catch (const c10::Error& e) {
    throw Diagnostic("", "cannot read torch.save file: " + firstLine(e));
  } catch (const std::exception& e) {  // std::bad_alloc for a record whose size is a lie, say
    throw Diagnostic("", std::string("cannot read torch.save file: ") + e.what());
  }
}

c10::IValue loadTorchSaveMember(const std::shared_ptr<MappedFile>& mapping, const ZipMember& member) {
  try {
    if (member.compressed) fail("compressed; a torch.save file inside a zip must be stored");
    const std::string_view bytes = mapping->view().substr(member.offset, member.size);
    if (!bytes.empty()) rejectLegacy(bytes[0]);
    checkZipStructure(bytes, ZipCrc::UpTo1MiB);  // its weights are views: not read here
    torch_save_detail::UnpickleOptions options;
    options.mapping = mapping;
    options.archiveOffset = member.offset;
    options.archiveSize = member.size;
    return readArchive(std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()), options);
  } catch (const Diagnostic& d) {
    throw Diagnostic(member.name, d.message());
  } catch (const c10::Error& e) {
    throw Diagnostic(member.name, "cannot read torch.save file: " + firstLine(e));
  }
}

c10::IValue loadTorchSave(const std::string& path) {
  try {
    refuseDirectory(path);
    // Mapped, not streamed: the structure is checked before LibTorch's reader
    // sees it, and only a regular file can be (a FIFO or device is refused).
    const MappedFile file(path);
    const std::string_view bytes = file.view();
    if (!bytes.empty()) rejectLegacy(bytes[0]);
    checkZipStructure(bytes, ZipCrc::All);
    return readArchive(std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
  } catch (Diagnostic& d) {
    throw d.inFile(path);
  } catch (const c10::Error& e) {
    throw Diagnostic("", "cannot read torch.save file: " + firstLine(e)).inFile(path);
  } catch (const std::ios_base::failure&) {
    throw Diagnostic("", std::string("cannot read: ") + std::strerror(errno)).inFile(path);
  }
}

namespace {

// The tensors in `value`, a TorchScript object's attributes (dicts nested),
// by dotted path under `prefix`.
void collectTensors(const c10::IValue& value, const std::string& prefix, std::map<std::string, at::Tensor>& out) {
  if (value.isTensor()) {
    out.emplace(prefix, value.toTensor());
    return;
  }
  if (!value.isGenericDict()) return;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) continue;
    const std::string& name = entry.key().toStringRef();
    collectTensors(entry.value(), prefix.empty() ? name : prefix + "." + name, out);
  }
}

// An object whose class has __setstate__ pickles a state of its own making,
// not its attributes: those modules are jit::load's to read.
void refuseCustomState(PyTorchStreamReader& reader) {
  for (const std::string& record : reader.getAllRecords()) {
    if (record.rfind("code/", 0) != 0 || record.size() < 3 || record.compare(record.size() - 3, 3, ".py") != 0) continue;
    at::DataPtr data;
    size_t size = 0;
    std::tie(data, size) = reader.getRecord(record);
    if (std::string_view(static_cast<const char*>(data.get()), size).find("def __setstate__") != std::string_view::npos) {
      fail("a class with __setstate__ (" + record + "): its objects' state is not their attributes");
    }
  }
}

}  // namespace

std::map<std::string, at::Tensor> loadTorchScriptTensors(const std::string& path) {
  try {
    auto mapping = std::make_shared<MappedFile>(path, MappedFile::Access::CopyOnWrite);
    if (mapping->size() == 0) fail("empty file");
    mapping->prefault();  // every weight is about to be read
    PyTorchStreamReader reader(std::make_shared<caffe2::serialize::MemoryReadAdapter>(
        mapping->bytes(), static_cast<off_t>(mapping->size())));
    if (!reader.hasRecord("data.pkl") || !reader.hasRecord("constants.pkl")) {
      fail("not a TorchScript module (torch.jit.save): no data.pkl and constants.pkl");
    }
    refuseCustomState(reader);
    at::DataPtr data;
    size_t size = 0;
    std::tie(data, size) = reader.getRecord("data.pkl");
    torch_save_detail::UnpickleOptions options;
    options.torchScriptObjects = true;
    options.mapping = mapping;
    const c10::IValue root = unpickle(std::string(static_cast<const char*>(data.get()), size), reader, options);
    std::map<std::string, at::Tensor> tensors;
    collectTensors(root, "", tensors);
    return tensors;
  } catch (Diagnostic& d) {
    if (d.file().empty()) d.inFile(path);
    throw;
  } catch (const c10::Error& e) {
    throw Diagnostic("", "cannot read TorchScript module: " + firstLine(e)).inFile(path);
  }
}

namespace {

// The zip archive torch.save writes around `pickle`: records in the order
// Python writes them, then "version" ("3\n", which every PyTorch 2.x reads).
// Storage
// data/<i> is tensors[i]'s bytes.
std::string archive(const std::string& pickle, const std::vector<at::Tensor>& tensors) {
  std::string bytes;
  ZipWriter writer([&bytes](const void* data, size_t size) { bytes.append(static_cast<const char*>(data), size); });
  writer.add("data.pkl", pickle.data(), pickle.size());
  const std::string order = "little";
  writer.add("byteorder", order.data(), order.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    writer.add("data/" + std::to_string(i), t.numel() > 0 ? t.data_ptr() : nullptr, t.nbytes());
  }
  writer.finish();
  return bytes;
}

}  // namespace

std::string saveTorchSave(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const std::vector<std::pair<std::string, at::Tensor>> prepared = prepare(tensors);
  std::vector<at::Tensor> storages;
  for (const auto& named : prepared) storages.push_back(named.second);
  return archive(pickleTensorDict(prepared), storages);
}

std::string saveTorchSaveValue(const c10::IValue& value) {
  std::vector<at::Tensor> storages;
  const c10::IValue prepared = torch_save_detail::prepareValue(value, storages);
  return archive(torch_save_detail::pickleValue(prepared), storages);
}

}  // namespace spmd