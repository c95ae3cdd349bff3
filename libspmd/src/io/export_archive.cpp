// A .pt2 file's parts: the program JSON, parsed with LibTorch's schema types
// (torch/csrc/utils/generated_serialization_types.h), and the weights, as
// views of the mapped file. Both layouts torch.export.save has written are
// read (export_internal.h describes them).
#include "export_internal.h"

#include "json_read.h"
#include "spmd/io/torch_save.h"
#include "spmd/io/zip_members.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/mapped_file.h"
#include "torch_save_internal.h"

#include <ATen/ops/from_blob.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

namespace spmd {
namespace export_detail {
namespace {

constexpr std::string_view kFlatProgram = "serialized_exported_program.json";

const ZipMember* findMember(const std::vector<ZipMember>& members, const std::string& name) {
  auto it = std::find_if(members.begin(), members.end(), [&](const ZipMember& m) { return m.name == name; });
  return it == members.end() ? nullptr : &*it;
}

std::string_view storedBytes(std::string_view zip, const ZipMember& m) {
  if (m.compressed) throw Diagnostic(m.name, "compressed; torch.export.save stores its members uncompressed");
  return zip.substr(m.offset, m.size);
}

// The "<stem>/" of a PT2 archive: the folder of an "archive_format" member
// that says "pt2".
std::optional<std::string> pt2Prefix(std::string_view zip, const std::vector<ZipMember>& members) {
  for (const ZipMember& m : members) {
    const size_t slash = m.name.find('/');
    if (slash == std::string::npos || m.name.substr(slash + 1) != "archive_format" || m.compressed) continue;
    std::string_view text = zip.substr(m.offset, m.size);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    if (text == "pt2") return m.name.substr(0, slash + 1);
  }
  return std::nullopt;
}

// The PT2 archive's one model: <prefix>models/<name>.json.
std::vector<const ZipMember*> modelMembers(const std::vector<ZipMember>& members, const std::string& prefix) {
  std::vector<const ZipMember*> models;
  const std::string folder = prefix + "models/";
  for (const ZipMember& m : members) {
    if (m.name.rfind(folder, 0) != 0 || m.name.size() <= folder.size() + 5) continue;
    const std::string rest = m.name.substr(folder.size());
    if (rest.find('/') == std::string::npos && rest.compare(rest.size() - 5, 5, ".json") == 0) models.push_back(&m);
  }
  return models;
}

// Python's json writes non-finite floats as the bare words Infinity,
// -Infinity and NaN (torch 2.6), which JSON has not; torch 2.14 writes them
// as those words in strings. The bare words become strings here, and
// floatsFromStrings reads them back.
std::string quoteNonFiniteWords(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') inString = false;
      continue;
    }
    if (c == '"') inString = true;
    bool replaced = false;
    for (std::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (text.compare(i, word.size(), word) == 0) {
        out += '"';
        out += word;
        out += '"';
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

std::optional<double> nonFinite(const nlohmann::json& v) {
  if (!v.is_string()) return std::nullopt;
  const std::string& s = v.get_ref<const std::string&>();
  if (s == "Infinity") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  return std::nullopt;
}

// Every "as_float" (and "as_floats" element) written as a word, a double again.
void floatsFromStrings(nlohmann::json& j) {
  if (j.is_array()) {
    for (auto& e : j) floatsFromStrings(e);
    return;
  }
  if (!j.is_object()) return;
  for (auto& [key, value] : j.items()) {
    if (key == "as_float") {
      if (auto f = nonFinite(value)) value = *f;
    } else if (key == "as_floats" && value.is_array()) {
      for (auto& e : value) {
        if (auto f = nonFinite(e)) e = *f;
      }
    } else {
      floatsFromStrings(value);
    }
  }
}

}  // namespace

bool isExportArchive(std::string_view zip) {
  const std::vector<ZipMember> members = zipMembers(zip);
  return findMember(members, std::string(kFlatProgram)) || pt2Prefix(zip, members);
}

ExportArchive findExportArchive(std::string_view zip) {
  const std::vector<ZipMember> members = zipMembers(zip);
  ExportArchive archive;
  if (const ZipMember* flat = findMember(members, std::string(kFlatProgram))) {
    archive.layout = ExportArchive::Layout::Flat;
    archive.programMember = flat->name;
    archive.programJson = storedBytes(zip, *flat);
    return archive;
  }
  const std::optional<std::string> prefix = pt2Prefix(zip, members);
  if (!prefix) throw Diagnostic("", "no torch.export program in this zip");
  const std::vector<const ZipMember*> models = modelMembers(members, *prefix);
  if (models.empty()) throw Diagnostic(*prefix + "models/", "the PT2 archive holds no model");
  if (models.size() > 1) {
    throw Diagnostic(*prefix + "models/", "the PT2 archive holds " + std::to_string(models.size()) +
                                              " models; spmd reads archives of one (torch.export.save's)");
  }
  archive.layout = ExportArchive::Layout::Pt2;
  archive.prefix = *prefix;
  archive.programMember = models[0]->name;
  const std::string file = models[0]->name.substr(prefix->size() + 7);
  archive.modelName = file.substr(0, file.size() - 5);
  archive.programJson = storedBytes(zip, *models[0]);
  return archive;
}

ser::ExportedProgram parseProgram(const ExportArchive& archive) {
  try {
    nlohmann::json j = parseJson(quoteNonFiniteWords(archive.programJson));
    floatsFromStrings(j);
    if (!j.is_object() || !j.contains("graph_module")) throw Diagnostic("", "not a torch.export program (no graph_module)");
    const nlohmann::json version = j.value("schema_version", nlohmann::json::object());
    const int64_t major = version.value("major", int64_t{-1});
    if (major != kSchemaMajor) {
      throw Diagnostic("schema_version", "schema version " + std::to_string(major) + "." +
                                             std::to_string(version.value("minor", int64_t{0})) + ": this build reads " +
                                             std::to_string(kSchemaMajor) + ".x (torch 2.3 and later)");
    }
    return j.get<ser::ExportedProgram>();
  } catch (Diagnostic& d) {
    throw Diagnostic(d.where().empty() ? archive.programMember : archive.programMember + ": " + d.where(), d.message());
  } catch (const nlohmann::json::exception& e) {
    throw Diagnostic(archive.programMember, std::string("not a torch.export program: ") + e.what());
  }
}

c10::ScalarType scalarTypeOf(ser::ScalarType type, const std::string& where) {
  switch (type) {
    case ser::ScalarType::BYTE: return c10::ScalarType::Byte;
    case ser::ScalarType::CHAR: return c10::ScalarType::Char;
    case ser::ScalarType::SHORT: return c10::ScalarType::Short;
    case ser::ScalarType::INT: return c10::ScalarType::Int;
    case ser::ScalarType::LONG: return c10::ScalarType::Long;
    case ser::ScalarType::HALF: return c10::ScalarType::Half;
    case ser::ScalarType::FLOAT: return c10::ScalarType::Float;
    case ser::ScalarType::DOUBLE: return c10::ScalarType::Double;
    case ser::ScalarType::BOOL: return c10::ScalarType::Bool;
    case ser::ScalarType::BFLOAT16: return c10::ScalarType::BFloat16;
    default: break;
  }
  throw Diagnostic(where, "dtype " + std::to_string(static_cast<int>(type)) +
                              " of torch.export's schema: spmd takes bool, integer and floating dtypes");
}

// ---- weights ---------------------------------------------------------------------

namespace {

// A torch.save member of the flat layout ({name: tensor}), its storages views of the mapping.
void readSavedDict(const std::shared_ptr<MappedFile>& mapping, const ZipMember& m,
                   std::map<std::string, at::Tensor>& into) {
  const c10::IValue dict = loadTorchSaveMember(mapping, m);
  if (!dict.isGenericDict()) throw Diagnostic(m.name, "not a {name: tensor} dict");
  for (const auto& item : dict.toGenericDict()) {
    if (!item.key().isString()) throw Diagnostic(m.name, "not a {name: tensor} dict");
    if (!item.value().isTensor()) continue;  // a constant that is no tensor (a custom object)
    into.emplace(item.key().toStringRef(), item.value().toTensor());
  }
}

// One weight of the PT2 archive: its storage's raw bytes in `file`, laid out
// as the tensor meta says.
at::Tensor rawWeight(const std::shared_ptr<MappedFile>& mapping, const ZipMember& file, const ser::TensorMeta& meta) {
  const c10::ScalarType dtype = scalarTypeOf(meta.get_dtype(), file.name);
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  if (file.compressed) throw Diagnostic(file.name, "compressed; the PT2 archive stores weights uncompressed");
  const int64_t numel = static_cast<int64_t>(file.size) / element;
  std::vector<int64_t> sizes, strides;
  for (const auto& s : meta.get_sizes()) {
    if (s.tag() != ser::SymInt::Tag::AS_INT) throw Diagnostic(file.name, "a weight of symbolic size");
    sizes.push_back(s.get_as_int());
  }
  for (const auto& s : meta.get_strides()) {
    if (s.tag() != ser::SymInt::Tag::AS_INT) throw Diagnostic(file.name, "a weight of symbolic stride");
    strides.push_back(s.get_as_int());
  }
  const int64_t offset = meta.get_storage_offset().tag() == ser::SymInt::Tag::AS_INT ? meta.get_storage_offset().get_as_int() : 0;
  if (sizes.size() != strides.size()) throw Diagnostic(file.name, "sizes and strides of different ranks");
  int64_t last = offset;  // the last element the view reads
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0 || strides[d] < 0 || sizes[d] > kMaxTensorElements) throw Diagnostic(file.name, "a negative or huge size");
    if (sizes[d] == 0) last = -1;
    if (last >= 0) last += (sizes[d] - 1) * strides[d];
  }
  if (last >= numel) {
    throw Diagnostic(file.name, std::to_string(file.size) + " bytes, too few for the weight's sizes and strides");
  }
  char* data = mapping->writableBytes() + file.offset;
  at::Tensor storage;
  if (numel > 0 && reinterpret_cast<uintptr_t>(data) % element == 0) {
    std::shared_ptr<MappedFile> keep = mapping;
    storage = at::from_blob(data, {numel}, [keep](void*) {}, at::TensorOptions().dtype(dtype));
  } else {
    storage = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (numel > 0) std::memcpy(storage.data_ptr(), data, static_cast<size_t>(numel * element));
  }
  return storage.as_strided(sizes, strides, offset);
}

// <prefix>data/<kind>/<model>_<kind>_config.json: {"config": {name:
// {"path_name", "use_pickle", "tensor_meta"}}}. Pickled ones are torch.save files.
void readPt2Payloads(const std::shared_ptr<MappedFile>& mapping, const std::vector<ZipMember>& members,
                     const ExportArchive& archive, const std::string& kind, std::map<std::string, at::Tensor>& into) {
  const std::string folder = archive.prefix + "data/" + kind + "/";
  // <model>_<kind>_config.json (torch 2.14 names the model "model")
  const ZipMember* config = findMember(members, folder + archive.modelName + "_" + kind + "_config.json");
  if (!config) config = findMember(members, folder + archive.modelName + "_model_" + kind + "_config.json");
  if (!config) return;  // a program without constants
  const std::string& configName = config->name;
  const std::string_view zip = mapping->view();
  nlohmann::json j;
  try {
    j = parseJson(std::string(storedBytes(zip, *config)));
  } catch (Diagnostic& d) {
    throw Diagnostic(configName, d.message());
  }
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object()) throw Diagnostic(configName, "no \"config\" object");
  for (const auto& [name, entry] : j["config"].items()) {
    const std::string where = configName + ": " + name;
    try {
      const ZipMember* file = findMember(members, folder + entry.at("path_name").get<std::string>());
      if (!file) throw Diagnostic(where, "names " + entry.at("path_name").get<std::string>() + ", which the archive lacks");
      if (entry.value("use_pickle", false)) {
        const c10::IValue v = loadTorchSaveMember(mapping, *file);
        if (v.isTensor()) into.emplace(name, v.toTensor());
        continue;
      }
      into.emplace(name, rawWeight(mapping, *file, entry.at("tensor_meta").get<ser::TensorMeta>()));
    } catch (const nlohmann::json::exception& e) {
      throw Diagnostic(where, std::string("malformed entry: ") + e.what());
    }
  }
}

}  // namespace

namespace {

// The PT2 archive's weights config: tied names share a path_name.
void pt2Aliases(std::string_view zip, const std::vector<ZipMember>& members, const ExportArchive& archive,
                WeightAliases& aliases) {
  const std::string folder = archive.prefix + "data/weights/";
  const ZipMember* config = findMember(members, folder + archive.modelName + "_weights_config.json");
  if (!config) config = findMember(members, folder + archive.modelName + "_model_weights_config.json");
  if (!config) return;
  try {
    const nlohmann::json j = parseJson(std::string(storedBytes(zip, *config)));
    for (const auto& [name, entry] : j.at("config").items()) {
      aliases.storage[name] = entry.at("path_name").get<std::string>();
    }
  } catch (Diagnostic& d) {
    throw Diagnostic(config->name, d.message());
  } catch (const nlohmann::json::exception& e) {
    throw Diagnostic(config->name, std::string("malformed: ") + e.what());
  }
}

// The flat layout's state dict: tied names are one tensor, saved once.
void flatAliases(std::string_view zip, const std::vector<ZipMember>& members, const std::shared_ptr<MappedFile>& mapping,
                 WeightAliases& aliases) {
  const ZipMember* state = findMember(members, "serialized_state_dict.pt");
  if (!state) return;
  const c10::IValue dict = mapping ? loadTorchSaveMember(mapping, *state)
                                   : loadTorchSaveBytes(std::string(storedBytes(zip, *state)));
  if (!dict.isGenericDict()) throw Diagnostic(state->name, "not a {name: tensor} dict");
  for (const auto& item : dict.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) continue;
    const at::Tensor& t = item.value().toTensor();
    std::ostringstream key;
    key << t.storage().unsafeGetStorageImpl() << "+" << t.storage_offset() << t.sizes() << t.strides();
    aliases.storage[item.key().toStringRef()] = key.str();
    aliases.order.push_back(item.key().toStringRef());
  }
}

}  // namespace

WeightAliases weightAliases(std::string_view zip, const ExportArchive& archive, const std::shared_ptr<MappedFile>& mapping) {
  WeightAliases aliases;
  const std::vector<ZipMember> members = zipMembers(zip);
  if (archive.layout == ExportArchive::Layout::Pt2) pt2Aliases(zip, members, archive, aliases);
  else flatAliases(zip, members, mapping, aliases);
  return aliases;
}

std::map<std::string, at::Tensor> readExportWeights(const std::shared_ptr<MappedFile>& mapping) {
  const std::string_view zip = mapping->view();
  const ExportArchive archive = findExportArchive(zip);
  const std::vector<ZipMember> members = zipMembers(zip);
  std::map<std::string, at::Tensor> weights;
  if (archive.layout == ExportArchive::Layout::Flat) {
    for (const char* name : {"serialized_state_dict.pt", "serialized_constants.pt"}) {
      if (const ZipMember* m = findMember(members, name)) readSavedDict(mapping, *m, weights);
    }
    return weights;
  }
  readPt2Payloads(mapping, members, archive, "weights", weights);
  readPt2Payloads(mapping, members, archive, "constants", weights);
  return weights;
}

}  // namespace export_detail
}  // namespace spmd
