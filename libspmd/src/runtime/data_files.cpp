#include "spmd/runtime/data_files.h"

#include "spmd/io/torch_save.h"
#include "spmd/io/zip_members.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"
#include "spmd/support/little_endian.h"
#include "spmd/support/mapped_file.h"
#include "spmd/support/text.h"

#include <ATen/ATen.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace spmd {
namespace {

// ---- .npy ----------------------------------------------------------------------

c10::optional<at::ScalarType> npyDtype(const std::string& descr) {
  static const std::map<std::string, at::ScalarType> types = {
      {"<f4", at::kFloat}, {"<f8", at::kDouble}, {"<f2", at::kHalf}, {"<i8", at::kLong}, {"<i4", at::kInt},
      {"<i2", at::kShort}, {"|i1", at::kChar},   {"|u1", at::kByte}, {"|b1", at::kBool}};
  auto it = types.find(descr);
  return it == types.end() ? c10::nullopt : c10::optional<at::ScalarType>(it->second);
}

// The value after `'key':` in a .npy header (a Python dict literal).
std::string headerField(const std::string& header, const std::string& key, const Diagnostic& bad) {
  const size_t at = header.find("'" + key + "':");
  if (at == std::string::npos) throw bad;
  size_t begin = header.find_first_not_of(' ', at + key.size() + 3);
  if (begin == std::string::npos) throw bad;
  const char open = header[begin];
  const size_t end = open == '(' ? header.find(')', begin) + 1 : open == '\'' ? header.find('\'', begin + 1) + 1
                                                                             : header.find_first_of(",}", begin);
  if (end == std::string::npos || end == 0 || end <= begin) throw bad;
  return header.substr(begin, end - begin);
}

std::vector<int64_t> parseShape(const std::string& tuple, const Diagnostic& bad) {
  std::vector<int64_t> shape;
  const std::string inner = tuple.substr(1, tuple.size() - 2);
  size_t pos = 0;
  while (pos < inner.size()) {
    const size_t comma = inner.find(',', pos);
    std::string item = inner.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    item.erase(std::remove(item.begin(), item.end(), ' '), item.end());
    if (!item.empty()) {
      if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 15) throw bad;
      shape.push_back(std::stoll(item));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return shape;
}

// A tensor over the .npy array that starts at `offset` of `file`'s mapping
// and takes at most `length` bytes; `where` names it in errors.
at::Tensor npyTensor(const std::shared_ptr<MappedFile>& file, size_t offset, size_t length, const std::string& where) {
  const Diagnostic bad("", "not a .npy array (numpy.save's format 1-3)");
  const char* p = file->bytes() + offset;
  if (length < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) throw Diagnostic(bad).inFile(where);
  const int major = static_cast<uint8_t>(p[6]);
  const size_t lengthBytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3 || length < 8 + lengthBytes) throw Diagnostic(bad).inFile(where);
  const size_t headerLength = littleEndian(p + 8, static_cast<int>(lengthBytes));
  const size_t dataStart = 8 + lengthBytes + headerLength;
  if (dataStart > length) throw Diagnostic(bad).inFile(where);
  const std::string header(p + 8 + lengthBytes, headerLength);
  try {
    const std::string descr = headerField(header, "descr", bad);
    const auto dtype = npyDtype(descr.substr(1, descr.size() - 2));
    if (!dtype) {
      throw Diagnostic("descr", "dtype " + echo(descr) + " has no torch tensor type here (little-endian float16/32/64, "
                                "int8/16/32/64, uint8 or bool; token ids go to --tokens)");
    }
    if (headerField(header, "fortran_order", bad) != "False") {
      throw Diagnostic("fortran_order", "Fortran-ordered arrays are not supported: save np.ascontiguousarray(a)");
    }
    const std::vector<int64_t> shape = parseShape(headerField(header, "shape", bad), bad);
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d != 0 && numel > (int64_t{1} << 50) / d) throw Diagnostic("shape", "the array is too large");
      numel *= d;
    }
    const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(*dtype);
    if (bytes > length - dataStart) {
      throw Diagnostic("shape", "the file holds " + std::to_string(length - dataStart) + " bytes of data, the shape needs " +
                                    std::to_string(bytes));
    }
    void* data = const_cast<char*>(p + dataStart);  // read only: spmd-run copies each step's rows
    return at::from_blob(data, shape, [file](void*) {}, at::TensorOptions().dtype(*dtype));
  } catch (Diagnostic& d) {
    throw d.inFile(where);
  }
}

// ---- .npz: an uncompressed zip of .npy members -----------------------------------

bool isDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::map<std::string, at::Tensor> npzTensors(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  std::map<std::string, at::Tensor> out;
  std::vector<ZipMember> members;
  try {
    members = zipMembers(*file);
  } catch (const Diagnostic&) {
    throw Diagnostic("", "not a zip file (numpy.savez's .npz)").inFile(path);
  }
  for (const ZipMember& m : members) {
    if (!endsWith(m.name, ".npy")) continue;
    if (m.compressed) {
      throw Diagnostic(echo(m.name), "the member is compressed (numpy.savez_compressed): save with numpy.savez, "
                               "which spmd-run maps without reading it whole").inFile(path);
    }
    const std::string name = m.name.substr(0, m.name.size() - 4);
    out[name] = npyTensor(file, m.offset, m.size, path + ":" + echo(m.name));
  }
  return out;
}

std::map<std::string, at::Tensor> npyFolderTensors(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  DIR* d = ::opendir(path.c_str());
  if (!d) throw Diagnostic("", std::string("cannot open: ") + std::strerror(errno)).inFile(path);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& entry : names) {
    if (!endsWith(entry, ".npy")) continue;
    const std::string file = path + "/" + entry;
    auto mapping = std::make_shared<MappedFile>(file);
    out[entry.substr(0, entry.size() - 4)] = npyTensor(mapping, 0, mapping->size(), file);
  }
  return out;
}

std::map<std::string, at::Tensor> torchSaveTensors(const std::string& path) {
  const c10::IValue dict = loadTorchSave(path);
  if (!dict.isGenericDict()) throw Diagnostic("", "expected a dict {input name: tensor}").inFile(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& item : dict.toGenericDict()) {
    if (item.key().isString() && item.value().isTensor()) out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

}  // namespace

std::map<std::string, at::Tensor> openDataTensors(const std::string& path) {
  if (isDirectory(path)) return npyFolderTensors(path);
  if (endsWith(path, ".npz")) return npzTensors(path);
  if (endsWith(path, ".npy")) {
    throw Diagnostic("", "a single .npy file: put one NAME.npy per graph input into a folder, and pass the folder")
        .inFile(path);
  }
  return torchSaveTensors(path);
}

TokenFile::TokenFile(const std::string& path, const std::string& dtype) : path_(path) {
  if (dtype != "uint16" && dtype != "uint32") throw Diagnostic("--token-dtype", "must be uint16 or uint32");
  width_ = dtype == "uint16" ? 2 : 4;
  MappedFile probe(path);  // checks the file; the mapping below outlives it
  bytes_ = probe.size();
  if (bytes_ % width_ != 0) {
    throw Diagnostic("", "its " + std::to_string(bytes_) + " bytes are not a whole number of " + dtype + " tokens")
        .inFile(path);
  }
  count_ = static_cast<int64_t>(bytes_ / width_);
  const int fd = ::open(path.c_str(), O_RDONLY);
  map_ = fd >= 0 && bytes_ > 0 ? ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  if (fd >= 0) ::close(fd);
  if (map_ == MAP_FAILED || (bytes_ > 0 && !map_)) {
    map_ = nullptr;
    throw Diagnostic("", std::string("cannot map: ") + std::strerror(errno)).inFile(path);
  }
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, bytes_);
}

at::Tensor TokenFile::windows(const std::vector<int64_t>& starts, int64_t length, int64_t shift) const {
  at::Tensor out = at::empty({static_cast<int64_t>(starts.size()), length}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  const auto* bytes = static_cast<const unsigned char*>(map_);
  for (size_t r = 0; r < starts.size(); ++r) {
    for (int64_t i = 0; i < length; ++i) {
      const size_t at = static_cast<size_t>(starts[r] + shift + i) * width_;
      dst[r * length + i] = static_cast<int64_t>(littleEndian(reinterpret_cast<const char*>(bytes + at), width_));
    }
  }
  return out;
}

}  // namespace spmd
