#include "spmd/io/artifact.h"

#include "spmd/io/graph_json.h"
#include "spmd/ops/dtype.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>

namespace spmd {
namespace {

using json = nlohmann::ordered_json;

// FNV-1a, 64 bits: enough to notice a truncated or edited artifact.
struct Checksum {
  uint64_t h = 1469598103934665603ull;
  void add(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  void add(const std::string& s) { add(s.data(), s.size()); }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

std::string writeArtifact(const Artifact& artifact) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  Checksum sum;
  const std::string graph = writeGraphJson(artifact.graph);
  sum.add(graph);
  json index = json::array();
  size_t record = 0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : artifact.state) {
    if (artifact.zeroState.count(name)) {
      index.push_back(json{{"name", name}, {"dtype", dtypeName(t.scalar_type())}, {"shape", t.sizes().vec()}, {"zeros", true}});
      continue;
    }
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    std::string key = "tensors/" + std::to_string(record++);
    index.push_back(json{{"name", name}, {"dtype", dtypeName(c.scalar_type())}, {"shape", c.sizes().vec()}, {"record", key}});
    sum.add(c.data_ptr(), c.nbytes());
    tensors.emplace_back(key, c);
  }
  const std::string indexText = index.dump();
  sum.add(indexText);
  json header{{"format", kArtifactFormat}, {"version", kArtifactVersion}, {"device", artifact.device},
              {"cudagraphs", artifact.cudagraphs},
              {"nodes", artifact.graph.nodes().size()}, {"checksum", sum.hex()}};
  const std::string headerText = header.dump(2) + "\n";
  writer.writeRecord("header.json", headerText.data(), headerText.size());
  writer.writeRecord("graph.json", graph.data(), graph.size());
  writer.writeRecord("tensors.json", indexText.data(), indexText.size());
  for (const auto& [key, t] : tensors) writer.writeRecord(key, t.data_ptr(), t.nbytes());
  writer.writeEndOfFile();
  return out;
}

namespace {

std::string record(caffe2::serialize::PyTorchStreamReader& zip, const std::string& name) {
  if (!zip.hasRecord(name)) throw Diagnostic("", "not an spmd artifact: no record '" + name + "'");
  auto [data, size] = zip.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

}  // namespace

at::Tensor zeroPlaceholder(c10::IntArrayRef shape, c10::ScalarType dtype) {
  return at::zeros({}, at::TensorOptions().dtype(dtype)).expand(shape);
}

bool isArtifact(const std::string& bytes) {
  try {
    caffe2::serialize::PyTorchStreamReader zip(
        std::make_unique<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    return zip.hasRecord("header.json") && zip.hasRecord("graph.json");
  } catch (const std::exception&) {
    return false;
  }
}

Artifact readArtifact(const std::string& bytes) {
  try {
    caffe2::serialize::PyTorchStreamReader zip(
        std::make_unique<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    json header = json::parse(record(zip, "header.json"));
    if (header.value("format", "") != kArtifactFormat) throw Diagnostic("header.json", "not an spmd artifact");
    if (header.value("version", 0) != kArtifactVersion) {
      throw Diagnostic("header.json", "unsupported artifact version " + header["version"].dump());
    }
    Checksum sum;
    const std::string graphText = record(zip, "graph.json");
    sum.add(graphText);
    const std::string indexText = record(zip, "tensors.json");
    Artifact artifact;
    artifact.device = header.value("device", "cpu");
    artifact.cudagraphs = header.value("cudagraphs", false);
    for (const auto& entry : json::parse(indexText)) {
      auto dtype = parseDtype(entry["dtype"].get<std::string>());
      if (!dtype) throw Diagnostic("tensors.json", "unknown dtype " + entry["dtype"].dump());
      const auto shape = entry["shape"].get<std::vector<int64_t>>();
      const std::string name = entry["name"].get<std::string>();
      if (entry.value("zeros", false)) {
        artifact.state.emplace(name, zeroPlaceholder(shape, *dtype));
        artifact.zeroState.insert(name);
        continue;
      }
      const std::string data = record(zip, entry["record"].get<std::string>());
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(*dtype));
      if (static_cast<size_t>(t.nbytes()) != data.size()) {
        throw Diagnostic(entry["record"].get<std::string>(), "tensor data has the wrong size");
      }
      std::memcpy(t.data_ptr(), data.data(), data.size());
      sum.add(data);
      artifact.state.emplace(name, t);
    }
    sum.add(indexText);
    if (sum.hex() != header.value("checksum", "")) {
      throw Diagnostic("header.json", "checksum mismatch: the artifact was altered or is damaged");
    }
    try {
      artifact.graph = readGraphJson(graphText);
    } catch (Diagnostic& d) {
      throw Diagnostic("graph.json" + d.where(), d.message());
    }
    return artifact;
  } catch (const Diagnostic&) {
    throw;
  } catch (const c10::Error& e) {
    throw Diagnostic("", "damaged artifact: " + firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw Diagnostic("", "damaged artifact: " + firstLine(e.what()));
  }
}

}  // namespace spmd
