#include "spmd/io/artifact.h"

#include "spmd/io/graph_json.h"
#include "spmd/io/output_file.h"
#include "spmd/io/zip_writer.h"
#include "spmd/ops/dtype.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"
#include "spmd/support/limits.h"
#include "spmd/support/mapped_file.h"
#include "spmd/support/phase_times.h"

#include "json_read.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>

namespace spmd {
namespace {

using json = nlohmann::ordered_json;

// A 64-bit sum of everything in the artifact: enough to notice a truncated
// or edited file (not an adversary). Each step is a bijection of one lane
// (xor a word, multiply by an odd constant, rotate), so one changed word
// always changes the sum; four lanes of 8-byte words keep it at memory
// speed. Words are read little-endian, as every host spmd runs on stores them.
class Checksum {
 public:
  void add(const void* data, size_t size) {
    begin(size);
    feed(data, size);
  }
  // add() a piece at a time: begin() with the whole size, then feed() the
  // pieces in order, each but the last a multiple of 32 bytes.
  void begin(size_t size) { lanes_[3] = mix(lanes_[3], size); }  // the length too: bytes moved from one field to the next change the sum
  void feed(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    // The lanes in locals: members could alias the bytes read (they are
    // chars), and reloading them each step would halve the speed.
    uint64_t a = lanes_[0], b = lanes_[1], c = lanes_[2], d = lanes_[3];
    for (; size >= 32; p += 32, size -= 32) {
      a = mix(a, word(p));
      b = mix(b, word(p + 8));
      c = mix(c, word(p + 16));
      d = mix(d, word(p + 24));
    }
    for (; size >= 8; p += 8, size -= 8) a = mix(a, word(p));
    if (size > 0) {
      uint64_t tail = 0;
      std::memcpy(&tail, p, size);
      b = mix(b, tail);
    }
    lanes_[0] = a, lanes_[1] = b, lanes_[2] = c, lanes_[3] = d;
  }
  void add(std::string_view s) { add(s.data(), s.size()); }
  std::string hex() const {
    uint64_t h = 0;
    for (uint64_t lane : lanes_) h = rotate((h ^ lane) * kOdd);
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }

 private:
  static constexpr uint64_t kOdd = 0x9e3779b97f4a7c15ull;
  static uint64_t word(const unsigned char* p) {
    uint64_t w;
    std::memcpy(&w, p, sizeof w);
    return w;
  }
  static uint64_t rotate(uint64_t x) { return (x << 29) | (x >> 35); }
  static uint64_t mix(uint64_t lane, uint64_t w) { return rotate((lane ^ w) * kOdd); }
  uint64_t lanes_[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
};

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// The header's fields as the checksum sees them: every field but the
// checksum itself, keys sorted (nlohmann::json sorts), so that an edited
// device or cudagraphs flag no longer matches.
std::string headerFieldsText(const nlohmann::json& header) {
  nlohmann::json fields = header;
  fields.erase("checksum");
  return fields.dump();
}

}  // namespace

namespace {

// Writes the artifact's records, each added to the checksum as it is
// written (the piece just summed is still in cache when it is written), in
// the order the reader sums them; header.json, which carries the sum, last.
class RecordWriter {
 public:
  explicit RecordWriter(OutputFile& out)
      : zip_([&out](const void* data, size_t size) { out.write(data, size); }) {}

  void add(const std::string& name, const void* data, size_t size) {
    sum_.begin(size);
    zip_.add(name, data, size, [this](const void* piece, size_t n) { sum_.feed(piece, n); });
  }
  void add(const std::string& name, std::string_view bytes) { add(name, bytes.data(), bytes.size()); }

  void finish(nlohmann::json header) {
    sum_.add(headerFieldsText(header));
    header["checksum"] = sum_.hex();
    const std::string text = header.dump(2) + "\n";
    zip_.add("header.json", text.data(), text.size());
    zip_.finish();
  }

 private:
  ZipWriter zip_;
  Checksum sum_;
};

// tensors/<i> for each tensor with values, and tensors.json indexing them all.
void writeTensors(const Artifact& artifact, RecordWriter& records) {
  json index = json::array();
  size_t written = 0;
  for (const auto& [name, t] : artifact.state) {
    if (artifact.zeroState.count(name)) {
      index.push_back(json{{"name", name}, {"dtype", dtypeName(t.scalar_type())}, {"shape", t.sizes().vec()}, {"zeros", true}});
      continue;
    }
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const std::string key = "tensors/" + std::to_string(written++);
    index.push_back(json{{"name", name}, {"dtype", dtypeName(c.scalar_type())}, {"shape", c.sizes().vec()}, {"record", key}});
    records.add(key, c.data_ptr(), c.nbytes());
  }
  records.add("tensors.json", index.dump());
}

// kernels/<k>.cu, and .cubin when compiled, and kernels.json naming them
// with the image's architecture.
void writeKernels(const Artifact& artifact, RecordWriter& records) {
  json list = json::array();
  for (size_t k = 0; k < artifact.kernels.size(); ++k) {
    const CompiledKernel& kernel = artifact.kernels[k];
    json entry{{"source", "kernels/" + std::to_string(k) + ".cu"}};
    records.add(entry["source"], kernel.source);
    if (!kernel.image.empty()) {
      entry["arch"] = kernel.arch;
      entry["image"] = "kernels/" + std::to_string(k) + ".cubin";
      records.add(entry["image"], kernel.image);
    }
    list.push_back(entry);
  }
  records.add("kernels.json", list.dump());
}

}  // namespace

void writeArtifact(const Artifact& artifact, const std::string& path) {
  TimedPhase phase("write " + path);
  OutputFile out(path);
  RecordWriter records(out);
  records.add("graph.json", writeGraphJson(artifact.graph));
  writeTensors(artifact, records);
  writeKernels(artifact, records);
  records.finish(nlohmann::json{{"format", kArtifactFormat}, {"version", kArtifactVersion}, {"device", artifact.device},
                                {"cudagraphs", artifact.cudagraphs}, {"nodes", artifact.graph.nodes().size()}});
  out.commit();
}

namespace {

using Zip = caffe2::serialize::PyTorchStreamReader;

std::string record(Zip& zip, const std::string& name) {
  if (!zip.hasRecord(name)) throw Diagnostic("", "not an spmd artifact: no record '" + echo(name) + "'");
  auto [data, size] = zip.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

// A JSON record, parsed within bounds; errors name the record.
nlohmann::json jsonRecord(Zip& zip, const std::string& name) {
  const std::string text = record(zip, name);
  try {
    return parseJson(text);
  } catch (const Diagnostic& d) {
    throw Diagnostic(name, d.message());
  }
}

nlohmann::json readHeader(Zip& zip) {
  nlohmann::json header = jsonRecord(zip, "header.json");
  if (!header.is_object() || header.value("format", nlohmann::json()) != kArtifactFormat) {
    throw Diagnostic("header.json", "not an spmd artifact");
  }
  const nlohmann::json version = header.value("version", nlohmann::json());
  if (version != kArtifactVersion) {
    throw Diagnostic("header.json/version", "unsupported artifact version " + briefJson(version) + " (this build reads " +
                                                std::to_string(kArtifactVersion) + "): lower the graph again with spmd-lower");
  }
  for (const char* key : {"device", "checksum"}) {
    if (!header.contains(key) || !header[key].is_string()) {
      throw Diagnostic(std::string("header.json/") + key, "expected a string");
    }
  }
  if (!header.contains("cudagraphs") || !header["cudagraphs"].is_boolean()) {
    throw Diagnostic("header.json/cudagraphs", "expected a boolean");
  }
  return header;
}

// One entry of tensors.json, checked before anything is allocated for it.
struct IndexEntry {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  bool zeros = false;
  std::string record;  // the data's record, unless zeros
};

IndexEntry indexEntry(const nlohmann::json& j, const std::string& where) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw Diagnostic(where, std::string("missing key '") + key + "'");
    return j[key];
  };
  if (!j.is_object()) throw Diagnostic(where, "expected an object");
  IndexEntry e;
  const nlohmann::json& name = field("name");
  const nlohmann::json& dtype = field("dtype");
  const nlohmann::json& shape = field("shape");
  if (!name.is_string()) throw Diagnostic(where + "/name", "expected a string");
  e.name = name.get<std::string>();
  auto parsed = dtype.is_string() ? parseDtype(dtype.get<std::string>()) : std::nullopt;
  if (!parsed) throw Diagnostic(where + "/dtype", "unknown dtype " + briefJson(dtype));
  e.dtype = *parsed;
  if (!shape.is_array()) throw Diagnostic(where + "/shape", "expected an array");
  for (const auto& d : shape) {
    if (!d.is_number_integer()) throw Diagnostic(where + "/shape", "expected integers, got " + briefJson(d));
    e.shape.push_back(d.get<int64_t>());
  }
  const std::string problem = shapeBoundProblem(e.shape);
  if (!problem.empty()) throw Diagnostic(where + "/shape", "shape with " + problem);
  e.zeros = j.value("zeros", nlohmann::json(false)) == true;
  if (!e.zeros) {
    const nlohmann::json& rec = field("record");
    if (!rec.is_string()) throw Diagnostic(where + "/record", "expected a string");
    e.record = rec.get<std::string>();
  }
  return e;
}

// Where the artifact's bytes are, and whether tensors may be views of them.
struct Source {
  std::string_view bytes;
  std::shared_ptr<MappedFile> mapping;  // set when `bytes` is all of it
};

// The bytes of entry `e`'s record, checked to lie within the file.
std::string_view recordData(Zip& zip, const Source& source, const IndexEntry& e) {
  if (!zip.hasRecord(e.record)) throw Diagnostic("", "not an spmd artifact: no record '" + echo(e.record) + "'");
  const size_t offset = zip.getRecordOffset(e.record);
  const size_t bytes = static_cast<size_t>(*boundedNumel(e.shape)) * c10::elementSize(e.dtype);
  if (offset > source.bytes.size() || bytes > source.bytes.size() - offset) {
    throw Diagnostic(e.record, "tensor data runs past the end of the file");
  }
  return source.bytes.substr(offset, bytes);
}

// The tensor of entry `e` over `data`: a view of the mapping where its
// alignment allows (ZipWriter aligns records to 64 bytes), else a copy.
at::Tensor tensorFrom(const IndexEntry& e, std::string_view data, const Source& source) {
  const bool aligned = reinterpret_cast<uintptr_t>(data.data()) % c10::elementSize(e.dtype) == 0;
  if (source.mapping && aligned && !data.empty()) {
    char* p = source.mapping->writableBytes() + (data.data() - source.mapping->bytes());
    std::shared_ptr<MappedFile> keep = source.mapping;
    return at::from_blob(p, e.shape, [keep](void*) {}, at::TensorOptions().dtype(e.dtype));
  }
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (!data.empty()) std::memcpy(t.data_ptr(), data.data(), data.size());
  return t;
}

// The JSON array record `name` holds as `text`; errors name the record.
nlohmann::json jsonArray(const std::string& text, const std::string& name) {
  nlohmann::json list;
  try {
    list = parseJson(text);
  } catch (const Diagnostic& d) {
    throw Diagnostic(name, d.message());
  }
  if (!list.is_array()) throw Diagnostic(name, "expected an array");
  return list;
}

// kernels.json and the records it names, added to `sum` in the order the
// writer added them.
std::vector<CompiledKernel> readKernels(Zip& zip, Checksum& sum) {
  const std::string text = record(zip, "kernels.json");
  const nlohmann::json list = jsonArray(text, "kernels.json");
  std::vector<CompiledKernel> kernels;
  auto named = [&](const nlohmann::json& entry, const char* key, const std::string& where) {
    if (!entry.contains(key) || !entry[key].is_string()) throw Diagnostic(where + "/" + key, "expected a string");
    return entry[key].get<std::string>();
  };
  for (size_t k = 0; k < list.size(); ++k) {
    const std::string where = "kernels.json/" + std::to_string(k);
    if (!list[k].is_object()) throw Diagnostic(where, "expected an object");
    CompiledKernel kernel;
    kernel.source = record(zip, named(list[k], "source", where));
    sum.add(kernel.source);
    if (list[k].contains("image")) {
      kernel.arch = named(list[k], "arch", where);
      kernel.image = record(zip, named(list[k], "image", where));
      sum.add(kernel.image);
    }
    kernels.push_back(std::move(kernel));
  }
  sum.add(text);
  return kernels;
}

Artifact readVerified(Zip& zip, const Source& source) {
  const nlohmann::json header = readHeader(zip);
  // Everything the checksum covers is read and summed before any of it is
  // believed: an altered size or shape must not allocate first.
  Checksum sum;
  const std::string graphText = record(zip, "graph.json");
  sum.add(graphText);
  const std::string indexText = record(zip, "tensors.json");
  const nlohmann::json index = jsonArray(indexText, "tensors.json");
  std::vector<IndexEntry> entries;
  std::vector<std::string_view> data;
  for (size_t i = 0; i < index.size(); ++i) {
    entries.push_back(indexEntry(index[i], "tensors.json/" + std::to_string(i)));
    data.push_back(entries.back().zeros ? std::string_view() : recordData(zip, source, entries.back()));
    if (!entries.back().zeros) sum.add(data.back());
  }
  sum.add(indexText);
  std::vector<CompiledKernel> kernels = readKernels(zip, sum);
  sum.add(headerFieldsText(header));
  if (sum.hex() != header["checksum"].get<std::string>()) {
    throw Diagnostic("header.json", "checksum mismatch: the artifact was altered or is damaged");
  }
  Artifact artifact;
  artifact.device = header["device"].get<std::string>();
  artifact.cudagraphs = header["cudagraphs"].get<bool>();
  artifact.kernels = std::move(kernels);
  for (size_t i = 0; i < entries.size(); ++i) {
    const IndexEntry& e = entries[i];
    if (e.zeros) {
      artifact.state.emplace(e.name, zeroPlaceholder(e.shape, e.dtype));
      artifact.zeroState.insert(e.name);
    } else {
      artifact.state.emplace(e.name, tensorFrom(e, data[i], source));
    }
  }
  try {
    artifact.graph = readGraphJson(graphText);
  } catch (Diagnostic& d) {
    throw Diagnostic("graph.json" + d.where(), d.message());
  }
  return artifact;
}

}  // namespace

at::Tensor zeroPlaceholder(c10::IntArrayRef shape, c10::ScalarType dtype) {
  return at::zeros({}, at::TensorOptions().dtype(dtype)).expand(shape);
}

bool isArtifact(std::string_view bytes) {
  try {
    Zip zip(std::make_unique<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    return zip.hasRecord("header.json") && zip.hasRecord("graph.json");
  } catch (const std::exception&) {
    return false;
  }
}

Artifact readArtifact(std::string_view bytes, const std::shared_ptr<MappedFile>& mapping) {
  try {
    Zip zip(std::make_unique<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    return readVerified(zip, Source{bytes, mapping});
  } catch (const Diagnostic&) {
    throw;
  } catch (const c10::Error& e) {
    throw Diagnostic("", "damaged artifact: " + echo(firstLine(e.what_without_backtrace()), 200));
  } catch (const std::exception& e) {
    throw Diagnostic("", "damaged artifact: " + echo(firstLine(e.what()), 200));
  }
}

}  // namespace spmd
