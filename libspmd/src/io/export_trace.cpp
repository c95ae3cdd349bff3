// A torch.export program becomes an spmd graph the way a TorchScript module
// does: its nodes run, on meta tensors, under LibTorch's tracer, and the
// TorchScript importer's conversion (convertTrace) turns the recorded ATen
// calls into the graph. Each node is called through the dispatcher by its
// schema, its arguments matched to the schema by name, so in-place updates
// of buffers, views and Python numbers in tensor arithmetic come out as they
// do for TorchScript. Symbolic sizes take the values --input gives.
#include "export_internal.h"

#include "spmd/ops/meta.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/phase_times.h"
#include "torchscript_internal.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace spmd {
namespace export_detail {
namespace {

namespace jit = torch::jit;
using torchscript_detail::baseName;
using torchscript_detail::isLibraryFile;
using torchscript_detail::NamedTensor;
using Tag = ser::Argument::Tag;

// ---- where a node came from ---------------------------------------------------

// The Python frame a node's stack_trace names that the user wrote: the
// innermost outside torch, else the innermost ("File \"p.py\", line 6, in f").
std::optional<std::pair<std::string, size_t>> userFrame(const std::string& stackTrace) {
  std::optional<std::pair<std::string, size_t>> user, any;
  std::istringstream lines(stackTrace);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t file = line.find("File \"");
    const size_t close = file == std::string::npos ? std::string::npos : line.find("\", line ", file + 6);
    if (close == std::string::npos) continue;
    const std::string path = line.substr(file + 6, close - file - 6);
    const size_t number = std::strtoul(line.c_str() + close + 8, nullptr, 10);
    if (number == 0) continue;
    any = std::make_pair(path, number);
    if (!isLibraryFile(path)) user = any;
  }
  return user ? user : any;
}

// The traced nodes of one program node take its source line (what sourceOf reads).
thread_local const jit::SourceRange* currentRange = nullptr;
void recordProgramSource(jit::Node* n) {
  if (currentRange) n->setSourceRange(*currentRange);
}

// ---- running the program ----------------------------------------------------------

class ProgramRunner {
 public:
  ProgramRunner(const ser::ExportedProgram& program, MetaFallbackScope& metaFallback)
      : graph_(program.get_graph_module().get_graph()), metaFallback_(metaFallback) {}

  void bindTensor(const std::string& name, const at::Tensor& t) { values_[name] = t; }
  void run(const ser::Node& node, size_t index);
  const c10::IValue& value(const std::string& name, const std::string& where) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw Diagnostic(where, "reads '" + name + "', which no earlier node made");
    return it->second;
  }
  at::Tensor tensor(const std::string& name, const std::string& where) const {
    const c10::IValue& v = value(name, where);
    if (!v.isTensor()) throw Diagnostic(where, "reads '" + name + "' as a tensor, which it is not");
    return v.toTensor();
  }

 private:
  std::string describe(const ser::Node& node, size_t index) const;
  void runSymbolic(const ser::Node& node, const std::string& where);
  void runGradModeRegion(const ser::Node& node, const std::string& where);
  void runVmapCall(const ser::Node& node, const std::string& call, const std::string& where);
  int64_t symInt(const ser::SymIntArgument& a, const std::string& where) const;
  std::vector<int64_t> symInts(const std::vector<ser::SymIntArgument>& list, const std::string& where) const;
  c10::IValue argument(const ser::Argument& a, const c10::Argument& formal, const std::string& where) const;
  c10::IValue number(const ser::Argument& a, const c10::TypePtr& type, const std::string& where) const;
  void bindOutputs(const ser::Node& node, jit::Stack& results);

  c10::OperatorHandle operatorThatRuns(const c10::OperatorHandle& op, const jit::Stack& stack);

  const ser::Graph& graph_;
  MetaFallbackScope& metaFallback_;
  std::unordered_map<std::string, c10::IValue> values_;  // tensors, tensor lists
  std::unordered_map<std::string, int64_t> symInts_;
  VmapLevels vmap_;
};

std::string ProgramRunner::describe(const ser::Node& node, size_t index) const {
  const auto& meta = node.get_metadata();
  auto trace = meta.find("stack_trace");
  std::string name = "node " + std::to_string(index);
  if (!node.get_outputs().empty() && node.get_outputs()[0].tag() == Tag::AS_TENSOR) {
    name = "node '" + node.get_outputs()[0].get_as_tensor().get_name() + "'";
  }
  name += " (" + node.get_target() + ")";
  if (trace != meta.end()) {
    if (auto frame = userFrame(trace->second)) return baseName(frame->first) + ":" + std::to_string(frame->second) + ": " + name;
  }
  return name;
}

int64_t ProgramRunner::symInt(const ser::SymIntArgument& a, const std::string& where) const {
  if (a.tag() == ser::SymIntArgument::Tag::AS_INT) return a.get_as_int();
  auto it = symInts_.find(a.get_as_name());
  if (it != symInts_.end()) return it->second;
  auto known = graph_.get_sym_int_values().find(a.get_as_name());
  if (known != graph_.get_sym_int_values().end() && known->second.tag() == ser::SymInt::Tag::AS_INT) {
    return known->second.get_as_int();
  }
  throw Diagnostic(where, "reads the symbolic size '" + a.get_as_name() + "', which no earlier node computed");
}

std::vector<int64_t> ProgramRunner::symInts(const std::vector<ser::SymIntArgument>& list, const std::string& where) const {
  std::vector<int64_t> ints;
  for (const auto& a : list) ints.push_back(symInt(a, where));
  return ints;
}

// A Python number where the schema takes a Tensor (aten.add_.Tensor(buf, 1))
// is what Python's argument parser makes of it: a 0-dim CPU tensor marked as
// a wrapped number, which the tracer records as a constant.
at::Tensor wrappedNumber(const c10::Scalar& s) {
  c10::impl::ExcludeDispatchKeyGuard untraced(c10::DispatchKey::Tracer);
  at::Tensor t = at::scalar_tensor(s, at::TensorOptions().dtype(s.type()));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// torch 2.6's schema types hold floats as double, later ones as F64 (which
// writes non-finite floats as strings).
double floatOf(double d) { return d; }
template <typename F64>
double floatOf(const F64& f) {
  return f.get();
}

c10::IValue ProgramRunner::number(const ser::Argument& a, const c10::TypePtr& type, const std::string& where) const {
  c10::Scalar s;
  switch (a.tag()) {
    case Tag::AS_INT: s = a.get_as_int(); break;
    case Tag::AS_FLOAT: s = floatOf(a.get_as_float()); break;
    case Tag::AS_BOOL: s = a.get_as_bool(); break;
    case Tag::AS_SYM_INT: s = symInt(a.get_as_sym_int(), where); break;
    default: throw std::logic_error("number: not a number");
  }
  if (type->kind() == c10::TypeKind::TensorType) return wrappedNumber(s);
  // TorchScript's Scalar is a number, never a bool (full(size, True, dtype=torch.bool)).
  if (type->kind() == c10::TypeKind::NumberType && s.isBoolean()) return static_cast<int64_t>(s.toBool());
  if (type->kind() == c10::TypeKind::ListType) return c10::IValue(std::vector<int64_t>{s.toLong()});  // int[1] dim=1
  if (s.isFloatingPoint()) return s.toDouble();
  if (s.isBoolean()) return s.toBool();
  return s.toLong();
}

c10::MemoryFormat memoryFormatOf(ser::MemoryFormat f, const std::string& where) {
  switch (f) {
    case ser::MemoryFormat::ContiguousFormat: return c10::MemoryFormat::Contiguous;
    case ser::MemoryFormat::ChannelsLast: return c10::MemoryFormat::ChannelsLast;
    case ser::MemoryFormat::ChannelsLast3d: return c10::MemoryFormat::ChannelsLast3d;
    case ser::MemoryFormat::PreserveFormat: return c10::MemoryFormat::Preserve;
    default: throw Diagnostic(where, "an unknown memory format");
  }
}

c10::IValue ProgramRunner::argument(const ser::Argument& a, const c10::Argument& formal, const std::string& where) const {
  c10::TypePtr type = formal.type();
  if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
  const std::string at = where + ": argument '" + formal.name() + "'";
  switch (a.tag()) {
    case Tag::AS_NONE: return c10::IValue();
    case Tag::AS_TENSOR: return value(a.get_as_tensor().get_name(), at);
    case Tag::AS_TENSORS: {
      c10::List<at::Tensor> list;
      for (const auto& t : a.get_as_tensors()) list.push_back(tensor(t.get_name(), at));
      return list;
    }
    case Tag::AS_OPTIONAL_TENSORS: {
      c10::List<std::optional<at::Tensor>> list;
      for (const auto& t : a.get_as_optional_tensors()) {
        if (t.tag() == ser::OptionalTensorArgument::Tag::AS_NONE) list.push_back(std::nullopt);
        else list.push_back(tensor(t.get_as_tensor().get_name(), at));
      }
      return list;
    }
    case Tag::AS_INT:
    case Tag::AS_FLOAT:
    case Tag::AS_BOOL:
    case Tag::AS_SYM_INT: return number(a, type, at);
    case Tag::AS_INTS: return c10::IValue(a.get_as_ints());
    case Tag::AS_SYM_INTS: return c10::IValue(symInts(a.get_as_sym_ints(), at));
    case Tag::AS_FLOATS: {
      std::vector<double> floats;
      for (const auto& f : a.get_as_floats()) floats.push_back(floatOf(f));
      return c10::IValue(floats);
    }
    case Tag::AS_BOOLS: {
      c10::List<bool> list;
      for (bool b : a.get_as_bools()) list.push_back(b);
      return list;
    }
    case Tag::AS_STRING: return c10::IValue(a.get_as_string());
    case Tag::AS_SCALAR_TYPE: return static_cast<int64_t>(scalarTypeOf(a.get_as_scalar_type(), at));
    case Tag::AS_MEMORY_FORMAT: return static_cast<int64_t>(memoryFormatOf(a.get_as_memory_format(), at));
    case Tag::AS_LAYOUT:
      if (a.get_as_layout() != ser::Layout::Strided) throw Diagnostic(at, "a sparse or mkldnn layout");
      return static_cast<int64_t>(c10::Layout::Strided);
    // Traced on the meta device, whatever device the program was exported
    // on; the conversion makes a meta device the CPU, and spmd-run places it.
    case Tag::AS_DEVICE: return c10::Device(c10::kMeta);
    case Tag::AS_GRAPH: throw Diagnostic(at, "a subgraph: higher-order ops are not supported");
    case Tag::AS_CUSTOM_OBJ: throw Diagnostic(at, "a custom object: spmd takes programs of tensors");
    case Tag::AS_SYM_FLOAT:
    case Tag::AS_SYM_FLOATS:
    case Tag::AS_SYM_BOOL:
    case Tag::AS_SYM_BOOLS: throw Diagnostic(at, "a symbolic float or bool: export with static shapes");
    default: break;
  }
  throw Diagnostic(at, "an argument kind spmd does not read");
}

// "torch.ops.aten.add_.Tensor" -> aten::add_, overload "Tensor".
std::optional<c10::OperatorName> operatorNameOf(const std::string& target) {
  const std::string prefix = "torch.ops.";
  if (target.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string rest = target.substr(prefix.size());
  const size_t first = rest.find('.'), last = rest.rfind('.');
  if (first == std::string::npos || last == first) return std::nullopt;
  std::string overload = rest.substr(last + 1);
  if (overload == "default") overload.clear();
  return c10::OperatorName(rest.substr(0, first) + "::" + rest.substr(first + 1, last - first - 1), overload);
}

// An op spmd runs in place of one the linked LibTorch lacks, with the
// program's argument names it renames.
struct Substitute {
  const char* target;
  const char* op;
  std::map<std::string, std::string> renamed;
};

// Grouped GEMMs of mixtures of experts: transformers' own custom op, and
// ATen's _grouped_mm (torch 2.8 and later) where this LibTorch has none.
const Substitute* substituteFor(const std::string& target) {
  static const std::vector<Substitute> substitutes = {
      {"torch.ops.transformers.grouped_mm_fallback.default", "spmd::grouped_mm", {}},
      {"torch.ops.aten._grouped_mm.default", "spmd::grouped_mm", {{"self", "input"}, {"mat2", "weight"}}},
  };
  for (const Substitute& s : substitutes) {
    if (target == s.target) return &s;
  }
  return nullptr;
}

// Arithmetic on symbolic sizes (_operator.mul(sym_size_int, 4)).
void ProgramRunner::runSymbolic(const ser::Node& node, const std::string& where) {
  const std::string op = node.get_target().substr(std::string("_operator.").size());
  std::vector<int64_t> in;
  for (const auto& named : node.get_inputs()) {
    const ser::Argument& a = named.get_arg();
    if (a.tag() == Tag::AS_SYM_INT) in.push_back(symInt(a.get_as_sym_int(), where));
    else if (a.tag() == Tag::AS_INT) in.push_back(a.get_as_int());
    else throw Diagnostic(where, "symbolic arithmetic on what is no integer");
  }
  int64_t r = 0;
  if (in.size() == 2 && op == "add") r = in[0] + in[1];
  else if (in.size() == 2 && op == "sub") r = in[0] - in[1];
  else if (in.size() == 2 && op == "mul") r = in[0] * in[1];
  else if (in.size() == 2 && op == "floordiv" && in[1] != 0) r = (in[0] - (((in[0] % in[1]) + in[1]) % in[1])) / in[1];
  else if (in.size() == 2 && op == "mod" && in[1] != 0) r = ((in[0] % in[1]) + in[1]) % in[1];
  else if (in.size() == 1 && op == "neg") r = -in[0];
  else throw Diagnostic(where, "symbolic arithmetic '" + op + "' is not supported: export with static shapes");
  if (node.get_outputs().size() == 1 && node.get_outputs()[0].tag() == Tag::AS_SYM_INT &&
      node.get_outputs()[0].get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_NAME) {
    symInts_[node.get_outputs()[0].get_as_sym_int().get_as_name()] = r;
  }
}

// wrap_with_set_grad_enabled(enabled, body, *args): export's record of a
// `with torch.no_grad()` or `torch.set_grad_enabled(...)` block (transformers'
// rotary embeddings compute their cos and sin so). The body's nodes run here,
// in names of their own; where the block disabled gradients its results are
// detached, so that no gradient flows back through them, as in eager.
void ProgramRunner::runGradModeRegion(const ser::Node& node, const std::string& where) {
  const auto& in = node.get_inputs();
  if (in.size() < 2 || in[0].get_arg().tag() != Tag::AS_BOOL || in[1].get_arg().tag() != Tag::AS_GRAPH) {
    throw Diagnostic(where, "wrap_with_set_grad_enabled without its flag and body");
  }
  const bool enabled = in[0].get_arg().get_as_bool();
  const ser::Graph& body = *in[1].get_arg().get_as_graph().get_graph();
  if (body.get_inputs().size() != in.size() - 2) {
    throw Diagnostic(where, "wrap_with_set_grad_enabled's body takes " + std::to_string(body.get_inputs().size()) +
                                " inputs, given " + std::to_string(in.size() - 2));
  }
  std::unordered_map<std::string, c10::IValue> bound;
  for (size_t i = 2; i < in.size(); ++i) {
    const ser::Argument& given = in[i].get_arg();
    const ser::Argument& formal = body.get_inputs()[i - 2];
    if (given.tag() != Tag::AS_TENSOR || formal.tag() != Tag::AS_TENSOR) {
      throw Diagnostic(where, "wrap_with_set_grad_enabled reads an argument that is not a tensor");
    }
    bound[formal.get_as_tensor().get_name()] = value(given.get_as_tensor().get_name(), where);
  }
  std::unordered_map<std::string, c10::IValue> outer = std::exchange(values_, std::move(bound));
  const auto& nodes = body.get_nodes();
  for (size_t k = 0; k < nodes.size(); ++k) run(nodes[k], k);
  jit::Stack results;
  for (const ser::Argument& out : body.get_outputs()) {
    if (out.tag() != Tag::AS_TENSOR) throw Diagnostic(where, "wrap_with_set_grad_enabled returns what is not a tensor");
    const at::Tensor t = tensor(out.get_as_tensor().get_name(), where);
    results.push_back(enabled ? t : t.detach());
  }
  values_ = std::move(outer);
  if (node.get_outputs().size() == 1 && node.get_outputs()[0].tag() == Tag::AS_TENSORS) {
    std::vector<at::Tensor> list;
    for (const c10::IValue& r : results) list.push_back(r.toTensor());
    results = jit::Stack{c10::IValue(list)};
  }
  bindOutputs(node, results);
}

void ProgramRunner::bindOutputs(const ser::Node& node, jit::Stack& results) {
  const auto& outputs = node.get_outputs();
  // One Tensor[] result (split, unbind) may be written as one output per element.
  if (results.size() == 1 && results[0].isTensorList() && !outputs.empty() && outputs[0].tag() == Tag::AS_TENSOR) {
    const auto list = results[0].toTensorVector();
    for (size_t i = 0; i < outputs.size() && i < list.size(); ++i) {
      if (outputs[i].tag() == Tag::AS_TENSOR) values_[outputs[i].get_as_tensor().get_name()] = list[i];
    }
    return;
  }
  for (size_t i = 0; i < outputs.size() && i < results.size(); ++i) {
    const ser::Argument& out = outputs[i];
    if (out.tag() == Tag::AS_TENSOR && results[i].isTensor()) {
      values_[out.get_as_tensor().get_name()] = results[i];
    } else if (out.tag() == Tag::AS_TENSORS && results[i].isTensorList()) {
      const auto list = results[i].toTensorVector();
      for (size_t k = 0; k < out.get_as_tensors().size() && k < list.size(); ++k) {
        values_[out.get_as_tensors()[k].get_name()] = list[k];
      }
    } else if (out.tag() == Tag::AS_SYM_INT && out.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_NAME &&
               results[i].isInt()) {
      symInts_[out.get_as_sym_int().get_as_name()] = results[i].toInt();
    }
  }
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// A torch._functorch.predispatch call, made through functorch's C++ vmap.
void ProgramRunner::runVmapCall(const ser::Node& node, const std::string& call, const std::string& where) {
  auto named = [&](const std::string& name) { return tensor(name, where); };
  auto bind = [&](const std::string& name, const at::Tensor& t) { values_[name] = t; };
  vmap_.run(node, call, named, bind, where);
}

// The op a node runs, tried first off the trace on the same arguments:
// - core ATen has ops whose meta function is Python's alone
//   (_native_batch_norm_legit_functional): such an op runs on CPU stand-ins
//   from then on, so that the traced call succeeds;
// - export drops a .contiguous() that its fake tensors did not need (after
//   SDPA, whose result it lays out as the fused kernels do), so a view may
//   meet strides it cannot view on the meta device: a reshape, which copies
//   only there, computes the same.
c10::OperatorHandle ProgramRunner::operatorThatRuns(const c10::OperatorHandle& op, const jit::Stack& stack) {
  jit::Stack probe = stack;
  c10::impl::ExcludeDispatchKeyGuard untraced(c10::DispatchKey::Tracer);
  try {
    op.callBoxed(&probe);
    return op;
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    if (what.find("Meta") != std::string::npos) metaFallback_.standInOnCpu(op);
    if (op.operator_name() == c10::OperatorName("aten::view", "") && what.find("view size is not compatible") != std::string::npos) {
      return c10::Dispatcher::singleton().findSchemaOrThrow("aten::reshape", "");
    }
  }
  return op;
}

void ProgramRunner::run(const ser::Node& node, size_t index) {
  const std::string where = describe(node, index);
  const std::string& target = node.get_target();
  if (target == "torch.ops.higher_order.wrap_with_set_grad_enabled") return runGradModeRegion(node, where);
  if (target.rfind("torch.ops.higher_order.", 0) == 0) {
    throw Diagnostic(where, "higher-order op '" + target.substr(23) +
                                "': spmd takes programs of ATen ops (no cond, while_loop, map, ...)");
  }
  if (target.rfind("_operator.", 0) == 0) return runSymbolic(node, where);
  const std::string functorch = "torch._functorch.predispatch.";
  if (target.rfind(functorch, 0) == 0) return runVmapCall(node, target.substr(functorch.size()), where);
  // A check of what export saw, with no results: functorch has no batching
  // rule for it, and the batched ops keep dtype, device and layout anyway.
  if (target == "torch.ops.aten._assert_tensor_metadata.default" && vmap_.entered()) return;
  const std::optional<c10::OperatorName> name = operatorNameOf(target);
  auto op = name ? c10::Dispatcher::singleton().findSchema(*name) : std::nullopt;
  const Substitute* substitute = op ? nullptr : substituteFor(target);
  if (substitute) op = c10::Dispatcher::singleton().findSchema({substitute->op, ""});
  if (!op) throw Diagnostic(where, "'" + target + "' is no operator this LibTorch has");
  const c10::FunctionSchema& schema = op->schema();
  std::unordered_map<std::string, const ser::Argument*> byName;
  for (const auto& named : node.get_inputs()) {
    if (!substitute) {
      byName[named.get_name()] = &named.get_arg();
      continue;
    }
    // The substitute takes what the original's defaults leave out (an absent bias, out_dtype).
    if (named.get_arg().tag() == Tag::AS_NONE) continue;
    auto renamed = substitute->renamed.find(named.get_name());
    byName[renamed == substitute->renamed.end() ? named.get_name() : renamed->second] = &named.get_arg();
  }
  jit::Stack stack;
  for (const c10::Argument& formal : schema.arguments()) {
    auto it = byName.find(formal.name());
    if (it != byName.end()) {
      stack.push_back(argument(*it->second, formal, where));
      byName.erase(it);
    } else if (formal.default_value()) {
      stack.push_back(*formal.default_value());
    } else {
      throw Diagnostic(where, "no value for argument '" + formal.name() + "' of " + c10::toString(schema.operator_name()));
    }
  }
  if (!byName.empty()) {
    throw Diagnostic(where, c10::toString(schema.operator_name()) + " has no argument '" + byName.begin()->first + "'");
  }
  jit::SourceRange range;
  const auto& meta = node.get_metadata();
  auto trace = meta.find("stack_trace");
  std::optional<std::pair<std::string, size_t>> frame;
  if (trace != meta.end()) frame = userFrame(trace->second);
  if (frame) range = jit::SourceRange(std::make_shared<jit::Source>(std::string(" "), frame->first, frame->second), 0, 1);
  const c10::OperatorHandle runs = operatorThatRuns(*op, stack);
  currentRange = frame ? &range : nullptr;
  try {
    runs.callBoxed(&stack);
  } catch (const c10::Error& e) {
    currentRange = nullptr;
    throw Diagnostic(where, firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    currentRange = nullptr;
    throw Diagnostic(where, firstLine(e.what()));
  }
  currentRange = nullptr;
  bindOutputs(node, stack);
}

}  // namespace

Graph traceProgram(const ser::ExportedProgram& program, const std::string& fileName, const std::vector<InputSpec>& given,
                   const WeightAliases& aliases) {
  auto storageOf = [&](const Placeholder* p) {
    auto it = aliases.storage.find(p->exportName);
    return it == aliases.storage.end() ? "name " + p->exportName : "storage " + it->second;
  };
  ensureSpmdOpsRegistered();
  const ser::Graph& graph = program.get_graph_module().get_graph();
  const ser::GraphSignature& signature = program.get_graph_module().get_signature();
  refuseUnsupportedOutputs(signature);
  std::vector<Placeholder> all = placeholders(signature);
  for (Placeholder& p : all) {  // a tied weight's first name in the module
    if (p.kind == InputKind::Data) continue;
    auto first = std::find_if(aliases.order.begin(), aliases.order.end(), [&](const std::string& name) {
      auto it = aliases.storage.find(name);
      return it != aliases.storage.end() && "storage " + it->second == storageOf(&p);
    });
    if (first != aliases.order.end()) p.name = *first;
  }
  std::vector<InputSpec> dataSpecs;
  std::vector<NamedTensor> state;
  std::vector<const Placeholder*> dataPlaces, statePlaces, tiedPlaces;
  for (const Placeholder& p : all) {
    if (p.kind == InputKind::Data) {
      dataSpecs.push_back(dataSpec(graph, p, given));
      dataPlaces.push_back(&p);
    } else if (std::any_of(statePlaces.begin(), statePlaces.end(),
                           [&](const Placeholder* s) { return storageOf(s) == storageOf(&p); })) {
      // A tied parameter (GPT's embedding and head) is one placeholder per
      // name: one input, under the first name, read by both.
      tiedPlaces.push_back(&p);
    } else {
      const ser::TensorMeta& meta = metaOf(graph, p.argName);
      at::Tensor t = metaTensor(meta, p.name);
      if (p.kind == InputKind::Parameter) t.requires_grad_(meta.get_requires_grad() && c10::isFloatingType(t.scalar_type()));
      state.push_back({p.name, t, p.kind});
      statePlaces.push_back(&p);
    }
  }
  for (const InputSpec& s : given) {
    if (std::none_of(dataPlaces.begin(), dataPlaces.end(), [&](const Placeholder* p) { return p->name == s.name; })) {
      throw Diagnostic("--input " + s.name, "the program has no input '" + s.name + "'");
    }
  }
  MetaFallbackScope metaFallback;
  jit::Stack inputs;
  for (const InputSpec& s : dataSpecs) inputs.emplace_back(at::zeros(s.shape, at::TensorOptions().dtype(s.dtype).device(at::kMeta)));
  for (const NamedTensor& s : state) inputs.emplace_back(s.tensor);

  ProgramRunner runner(program, metaFallback);
  auto body = [&](jit::Stack traced) {
    for (size_t i = 0; i < dataPlaces.size(); ++i) runner.bindTensor(dataPlaces[i]->argName, traced[i].toTensor());
    for (size_t i = 0; i < statePlaces.size(); ++i) runner.bindTensor(statePlaces[i]->argName, traced[dataPlaces.size() + i].toTensor());
    for (const Placeholder* tied : tiedPlaces) {
      auto first = std::find_if(statePlaces.begin(), statePlaces.end(),
                                [&](const Placeholder* s) { return storageOf(s) == storageOf(tied); });
      runner.bindTensor(tied->argName, runner.tensor((*first)->argName, "graph_signature"));
    }
    const auto& nodes = graph.get_nodes();
    for (size_t i = 0; i < nodes.size(); ++i) runner.run(nodes[i], i);
    jit::Stack outputs;
    const auto& outs = graph.get_outputs();
    const auto& specs = signature.get_output_specs();
    for (size_t i = 0; i < specs.size() && i < outs.size(); ++i) {
      if (outs[i].tag() != Tag::AS_TENSOR) throw Diagnostic("output " + std::to_string(i), "not a tensor");
      const at::Tensor value = runner.tensor(outs[i].get_as_tensor().get_name(), "output " + std::to_string(i));
      if (specs[i].tag() == ser::OutputSpec::Tag::BUFFER_MUTATION) {
        // The functional program returns the buffer's new value: written
        // back in place, as the module did, the conversion makes it a state update.
        const std::string& buffer = specs[i].get_buffer_mutation().get_buffer_name();
        auto p = std::find_if(statePlaces.begin(), statePlaces.end(), [&](const Placeholder* s) { return s->name == buffer; });
        if (p == statePlaces.end()) throw Diagnostic("graph_signature", "a mutation of unknown buffer '" + buffer + "'");
        runner.tensor((*p)->argName, "graph_signature").copy_(value);
      } else {
        outputs.emplace_back(value);
      }
    }
    if (outputs.empty()) throw Diagnostic("graph_signature", "the program returns nothing: its first output must be the loss");
    const at::Tensor loss = outputs[0].toTensor();
    if (loss.dim() != 0 || !c10::isFloatingType(loss.scalar_type())) {
      throw Diagnostic("output 0", "the first output is " + std::string(c10::toString(loss.scalar_type())) + " of " +
                                       std::to_string(loss.dim()) + " dimensions: spmd trains a program whose first output is the loss, a floating scalar");
    }
    return outputs;
  };
  std::shared_ptr<jit::Graph> traced;
  {
    TimedPhase phase("trace the program on the meta device");
    at::NoGradGuard noGrad;
    jit::tracer::setRecordSourceLocation(&recordProgramSource);
    try {
      traced = jit::tracer::trace(std::move(inputs), body, [](const at::Tensor&) { return std::string(); },
                                  /*strict=*/false, /*force_outplace=*/false).first->graph;
    } catch (const c10::Error& e) {  // outside a node's call: writing back a buffer, say
      jit::tracer::setRecordSourceLocation([](jit::Node*) {});
      throw Diagnostic("graph_signature", firstLine(e.what_without_backtrace()));
    } catch (...) {
      jit::tracer::setRecordSourceLocation([](jit::Node*) {});
      throw;
    }
    jit::tracer::setRecordSourceLocation([](jit::Node*) {});
  }
  TimedPhase phase("convert the trace");
  Graph result = torchscript_detail::convertTrace(*traced, dataSpecs, state, fileName);
  result.setWeights(WeightsRef{fileName, "pt2"});
  return result;
}

}  // namespace export_detail
}  // namespace spmd
