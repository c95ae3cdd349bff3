// What the files of the torch.export importer share: export_archive.cpp
// finds the program and the weights in a .pt2 zip and parses the program with
// LibTorch's own schema types; export_trace.cpp runs its nodes through the
// dispatcher under LibTorch's tracer, so that the TorchScript importer's
// conversion (torchscript_convert.cpp) makes the spmd graph of it.
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/generated_serialization_types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

class MappedFile;

namespace export_detail {

namespace ser = torch::_export;

// The schema major version this importer reads (torch/_export/serde/schema.py's
// SCHEMA_VERSION[0]): 8 from torch 2.3 on. Minor versions only add fields.
constexpr int64_t kSchemaMajor = 8;

// Where a .pt2 zip keeps what spmd reads. torch 2.6 and 2.7 write the flat
// layout: serialized_exported_program.json, serialized_state_dict.pt and
// serialized_constants.pt (torch.save files) at the top. torch 2.8 and later
// write the PT2 archive: <stem>/archive_format ("pt2"), the program in
// <stem>/models/<model>.json, each weight's raw bytes in
// <stem>/data/weights/<file>, described by
// <stem>/data/weights/<model>_weights_config.json, and constants
// likewise under data/constants/.
struct ExportArchive {
  enum class Layout { Flat, Pt2 };
  Layout layout = Layout::Flat;
  std::string programMember;  // the program JSON's name in the zip
  std::string_view programJson;
  std::string prefix;         // "<stem>/" of a PT2 archive, "" when flat
  std::string modelName;      // the PT2 archive's model ("model")
};

// Whether `zip` (a whole zip file) holds a torch.export program.
bool isExportArchive(std::string_view zip);
// Throws Diagnostic (where: the member) when the zip holds no program or
// holds it compressed.
ExportArchive findExportArchive(std::string_view zip);
// The program, parsed with LibTorch's types. Throws Diagnostic for JSON that
// is not a program or a schema major version other than kSchemaMajor.
ser::ExportedProgram parseProgram(const ExportArchive& archive);

// The parameters, buffers and tensor constants of the program by the names
// its graph signature gives them (the module's parameter_name and
// buffer_name, the constants' tensor_constant_name): views of `mapping`
// where their bytes lie in it uncompressed, else copies.
std::map<std::string, at::Tensor> readExportWeights(const std::shared_ptr<MappedFile>& mapping);

// Which names of the program's weights are one tensor (a tied embedding
// and head): `storage` maps each name to a key its aliases share; `order`
// is the module's order of names (the flat layout's state dict), where the
// first name of a tensor is the one named_parameters() gives. torch 2.6
// names a tied weight by its last name in the signature; torch 2.14 gives
// each use its own name (the PT2 archive's weights config then shares the
// file, and `order` stays empty: the signature's first name is the first).
struct WeightAliases {
  std::map<std::string, std::string> storage;
  std::vector<std::string> order;
};
// `mapping`: the file's mapping, when `zip` is it (the flat state dict is
// then read as views, not copied).
WeightAliases weightAliases(std::string_view zip, const ExportArchive& archive,
                            const std::shared_ptr<MappedFile>& mapping);

// ---- the program's types ----------------------------------------------------

// Throws Diagnostic (where `where`) for a dtype spmd has no use for.
c10::ScalarType scalarTypeOf(ser::ScalarType type, const std::string& where);

// The program's signature (export_signature.cpp): its placeholders in order,
// their types, and the output kinds spmd takes.
struct Placeholder {
  std::string argName;  // its name in the graph
  std::string name;     // the module's (parameter_name, ...) or the user input's
  InputKind kind;
  std::string exportName = name;  // name as the signature gives it, before a tied one's renaming
};
std::vector<Placeholder> placeholders(const ser::GraphSignature& signature);
const ser::TensorMeta& metaOf(const ser::Graph& graph, const std::string& name);
// A user input's spec: the program's dtype and sizes, which --input may
// restate and must then agree with; a symbolic size takes --input's value.
InputSpec dataSpec(const ser::Graph& graph, const Placeholder& p, const std::vector<InputSpec>& given);
// An empty meta tensor of a parameter's or buffer's type.
at::Tensor metaTensor(const ser::TensorMeta& meta, const std::string& name);
// Throws Diagnostic for an output kind spmd cannot take (a written user input,
// a joint program's gradients, an effect token).
void refuseUnsupportedOutputs(const ser::GraphSignature& signature);

// ---- vmap regions (export_vmap.cpp) -----------------------------------------

// The vmap levels a program has entered (its torch._functorch.predispatch
// calls), entered again through functorch's C++ vmap while it is traced;
// whatever is still entered when this goes (a program that failed inside a
// vmap) is left.
class VmapLevels {
 public:
  VmapLevels() = default;
  VmapLevels(const VmapLevels&) = delete;
  VmapLevels& operator=(const VmapLevels&) = delete;
  ~VmapLevels();
  // Runs the program's call torch._functorch.predispatch.CALL of `node`
  // (entering or leaving a vmap, moving a tensor in or out of one): its
  // tensors by name from `tensorNamed`, its result to `bind`.
  void run(const ser::Node& node, const std::string& call,
           const std::function<at::Tensor(const std::string&)>& tensorNamed,
           const std::function<void(const std::string&, const at::Tensor&)>& bind, const std::string& where);
  void push(int64_t batchSize, const std::string& randomness, const std::string& where);
  void pop(const std::string& where);
  bool entered() const { return !levels_.empty(); }
  at::Tensor addBatchDim(const at::Tensor& t, int64_t dim, int64_t recordedLevel, const std::string& where);
  at::Tensor removeBatchDim(const at::Tensor& t, int64_t recordedLevel, int64_t batchSize, int64_t outDim,
                            const std::string& where);

 private:
  int64_t level(int64_t recorded, const std::string& where) const;
  std::vector<int64_t> levels_;
};

// ---- tracing the program (export_trace.cpp) ---------------------------------

// Placeholders whose names are aliases of one tensor are one graph input,
// under the tensor's first name in `aliases.order`, else the first
// placeholder's.
Graph traceProgram(const ser::ExportedProgram& program, const std::string& fileName,
                   const std::vector<InputSpec>& specs, const WeightAliases& aliases);

}  // namespace export_detail
}  // namespace spmd
