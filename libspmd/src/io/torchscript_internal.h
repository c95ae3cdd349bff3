// What the files of the TorchScript importer share; torchscript.cpp runs them
// in order: Python source lines, the data-dependence check, tracing with
// swapped-in tensors, and conversion of the traced graph.
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"
#include "spmd/support/diagnostic.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <string_view>
#include <set>
#include <unordered_map>
#include <string>
#include <vector>

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace spmd {
namespace torchscript_detail {

namespace jit = torch::jit;

// ---- Python source lines (torchscript_source.cpp) ---------------------------

// Whether a Python file is torch's own (a /torch/ folder in its path), and
// a path's last component: how a node's line names the user's frame.
bool isLibraryFile(const std::string& file);
std::string baseName(const std::string& path);
c10::optional<jit::SourceRange> preferredSource(const std::vector<jit::SourceRange>& frames);
std::string sourceOf(const jit::Node* n);
std::string describe(const jit::Node* n);
Diagnostic forwardFailure(const std::string& report);

// ---- data-dependent control flow (torchscript_checks.cpp) -------------------

void markDataDependence(const jit::Block* block, std::set<const jit::Value*>& dependent);

// ---- loading the module (torchscript_load.cpp) ------------------------------

// Skip leaves the parameters' and buffers' storages unread (their memory is
// allocated, never written): for a module whose parameters and buffers are
// swapped for meta tensors before anything reads them. Returns nullopt when
// an unread storage is reachable other than as a parameter or buffer (a
// plain tensor attribute, a custom class): such a module needs Read.
// Throws Diagnostic when the bytes are no loadable module.
enum class WeightValues { Read, Skip };
std::optional<jit::Module> loadModule(std::string_view bytes, WeightValues values);

// ---- running the module under the tracer (torchscript_trace.cpp) -----------

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  InputKind kind;
};

at::Tensor exampleInput(const InputSpec& spec, at::Generator& gen);
std::vector<NamedTensor> moduleState(const jit::Module& module);
std::shared_ptr<jit::Graph> traceForward(const jit::Module& module, std::shared_ptr<jit::Graph> forward,
                                         const std::vector<at::Tensor>& dataInputs,
                                         const std::vector<NamedTensor>& state);
std::vector<NamedTensor> onMeta(const std::vector<NamedTensor>& state);
void swapModuleTensors(jit::Module& module, const std::vector<NamedTensor>& to);

// ---- converting the traced graph (torchscript_convert.cpp) ------------------

// Which traced values are views of which: what an in-place write through a
// view must update.
class ViewTable {
 public:
  struct View {
    const jit::Value* base;
    Node node;     // the view call, as converted
    size_t index;  // which of its results (split, unbind)
  };

  void record(const jit::Value* view, const jit::Value* base, const Node& node, size_t index) {
    views_[view] = View{base, node, index};
    order_.push_back(view);
  }
  const View* find(const jit::Value* v) const {
    auto it = views_.find(v);
    return it == views_.end() ? nullptr : &it->second;
  }
  // The direct views of `base`, in the order they were taken.
  std::vector<std::pair<const jit::Value*, View>> of(const jit::Value* base) const {
    std::vector<std::pair<const jit::Value*, View>> found;
    for (const jit::Value* v : order_) {
      if (views_.at(v).base == base) found.emplace_back(v, views_.at(v));
    }
    return found;
  }

 private:
  std::unordered_map<const jit::Value*, View> views_;
  std::vector<const jit::Value*> order_;
};

// The base's new value after an in-place write made the view's new value
// `updated`; `base` is the base's value before (torchscript_views.cpp).
// `source` is the writing node's line, `where` its description for errors.
ValueId viewInverse(Graph& graph, const std::string& source, const std::string& where, const ViewTable::View& view,
                    ValueId base, ValueId updated);

// Values the traced forward computed from shapes and constants only
// (torchscript_fold.cpp).
class ShapeFolder {
 public:
  ShapeFolder(const Graph& graph, const std::unordered_map<const jit::Value*, ValueId>& values)
      : graph_(graph), values_(values) {}

  // Whether `n` makes only such values, so that it becomes no node: its
  // results are read where they are used.
  bool folds(const jit::Node* n);
  // The value `v` holds when it is a constant, a list literal of constants
  // (how traces spell int[]) or computed from shapes and constants alone.
  c10::optional<c10::IValue> value(const jit::Value* v);

 private:
  static bool computesOnlyScalars(const jit::Node* n);
  static bool isScalarType(const c10::TypePtr& type);
  bool readsOnlyShapeTensors(const jit::Node* n);
  bool isShapeTensor(const jit::Value* v);
  bool foldsToShapeTensor(const jit::Node* n);
  c10::optional<c10::IValue> runScalarNode(const jit::Node* n, const jit::Value* v);
  c10::optional<c10::IValue> foldedList(const jit::Node* n);

  const Graph& graph_;
  const std::unordered_map<const jit::Value*, ValueId>& values_;  // the graph's tensors
  std::unordered_map<const jit::Value*, c10::IValue> folded_;
};

// Dtypes recomputed on the meta device after the constants got theirs.
void retypeFromConstants(Graph& graph);

Graph convertTrace(const jit::Graph& traced, const std::vector<InputSpec>& ordered,
                   const std::vector<NamedTensor>& state, const std::string& fileName);

}  // namespace torchscript_detail
}  // namespace spmd
