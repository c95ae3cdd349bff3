// Static memory plan: value lifetimes from node order, views resolved to the
// buffers they alias, offsets by greedy-by-size placement.
#include "spmd/analysis/memory_plan.h"

#include "spmd/ir/boxing.h"
#include "spmd/ir/optimizer_state.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ops/op_traits.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <set>
#include <sstream>
#include <tuple>

namespace spmd {

namespace {

// CUDA's caching allocator hands out blocks in multiples of 512 bytes.
constexpr int64_t kAllocationGranularity = 512;

int64_t allocatedBytes(const Value& v) {
  return (bytes(v) + kAllocationGranularity - 1) / kAllocationGranularity * kAllocationGranularity;
}

// How a node output relates to the node's arguments.
struct OutputAliasing {
  ValueId base = kNoValue;  // the argument it may share memory with
  bool ownsMemory = true;   // needs a buffer of its own
};

// The alias sets an argument or return is in before the op runs, including
// those of its elements (a Tensor(a)[] list carries `a` on its element type).
void collectAliasSets(const c10::AliasInfo& info, std::set<c10::Symbol>& sets) {
  for (const c10::Symbol& s : info.beforeSets()) {
    if (s != c10::AliasInfo::wildcardSet()) sets.insert(s);
  }
  for (const c10::AliasInfo& contained : info.containedTypes()) collectAliasSets(contained, sets);
}

std::set<c10::Symbol> aliasSetsOf(const c10::Argument& a) {
  std::set<c10::Symbol> sets;
  if (a.alias_info()) collectAliasSets(*a.alias_info(), sets);
  return sets;
}

// For each node output, the schema return it comes from. A Tensor[] return
// spreads over as many outputs as the node has beyond the other returns.
std::vector<const c10::Argument*> returnsOfOutputs(const c10::FunctionSchema& schema, size_t numOutputs) {
  const auto& returns = schema.returns();
  std::vector<const c10::Argument*> result;
  for (size_t r = 0; r < returns.size() && result.size() < numOutputs; ++r) {
    bool isList = returns[r].type()->kind() == c10::TypeKind::ListType;
    size_t count = isList ? numOutputs - std::min(numOutputs, result.size() + returns.size() - 1 - r) : 1;
    result.insert(result.end(), count, &returns[r]);
  }
  result.resize(numOutputs, nullptr);
  return result;
}

// The tensor argument of `node` whose alias set `ret` shares, if any.
ValueId aliasedArgument(const Node& node, const c10::FunctionSchema& schema, const c10::Argument& ret) {
  std::set<c10::Symbol> retSets = aliasSetsOf(ret);
  if (retSets.empty()) return kNoValue;
  const auto& args = schema.arguments();
  for (size_t j = 0; j < args.size() && j < node.args.size(); ++j) {
    if (node.args[j].kind != Arg::Kind::Value) continue;
    for (const c10::Symbol& s : aliasSetsOf(args[j])) {
      if (retSets.count(s)) return node.args[j].value;
    }
  }
  return kNoValue;
}

ValueId firstTensorArgument(const Node& node) {
  for (const Arg& a : node.args) {
    if (a.kind == Arg::Kind::Value) return a.value;
  }
  return kNoValue;
}

std::vector<OutputAliasing> outputAliasing(const Node& node) {
  std::vector<OutputAliasing> result(node.outputs.size());
  auto op = findOperator(node);
  if (!op) return result;  // unverified graph: every output owns memory
  if (mayCopyOrAlias(node.op)) {
    for (auto& r : result) r.base = firstTensorArgument(node);
    return result;
  }
  if (hasTrait(node.op, OpTrait::ViewOfFirstArgument)) {
    for (auto& r : result) r = {firstTensorArgument(node), false};
    return result;
  }
  if (hasTrait(node.op, OpTrait::ViewsEachListElement) && !node.args.empty()) {
    const std::vector<ValueId>& elements = node.args[0].values;
    for (size_t k = 0; k < result.size() && k < elements.size(); ++k) result[k] = {elements[k], false};
    return result;
  }
  const c10::FunctionSchema& schema = op->schema();
  auto returns = returnsOfOutputs(schema, node.outputs.size());
  for (size_t k = 0; k < result.size(); ++k) {
    if (!returns[k]) continue;
    result[k].base = aliasedArgument(node, schema, *returns[k]);
    result[k].ownsMemory = result[k].base == kNoValue;
  }
  return result;
}

// Per value: where it is defined, what it aliases, and until when it lives.
struct Lifetimes {
  std::vector<int> first;     // defining node; -1 for graph inputs
  std::vector<int> last;
  std::vector<ValueId> base;  // the value it may share memory with
  std::vector<bool> ownsMemory;
};

// A read of `v` at node `at` keeps `v` alive, and everything it aliases.
void extendLifetime(Lifetimes& t, ValueId v, int at) {
  for (ValueId w = v; w != kNoValue; w = t.base[w]) t.last[w] = std::max(t.last[w], at);
}

Lifetimes computeLifetimes(const Graph& graph) {
  const size_t n = graph.numValues();
  Lifetimes t{std::vector<int>(n, -1), std::vector<int>(n, -1), std::vector<ValueId>(n, kNoValue),
              std::vector<bool>(n, false)};
  const auto& nodes = graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int at = static_cast<int>(i);
    for (const Arg& a : nodes[i].args) {
      if (a.kind == Arg::Kind::Value) extendLifetime(t, a.value, at);
      for (ValueId v : a.values) {
        if (v != kNoValue) extendLifetime(t, v, at);
      }
    }
    auto aliasing = outputAliasing(nodes[i]);
    for (size_t k = 0; k < nodes[i].outputs.size(); ++k) {
      ValueId v = nodes[i].outputs[k];
      if (v == kNoValue) continue;
      t.first[v] = t.last[v] = at;
      t.base[v] = aliasing[k].base;
      t.ownsMemory[v] = aliasing[k].ownsMemory;
    }
  }
  // What the step hands back is read after its last node.
  const int end = static_cast<int>(nodes.size()) - 1;
  for (ValueId v : graph.outputs()) extendLifetime(t, v, end);
  for (const StateUpdate& u : graph.updates()) extendLifetime(t, u.value, end);
  return t;
}

std::vector<BufferAssignment> ownedBuffers(const Graph& graph, const Lifetimes& t) {
  std::vector<BufferAssignment> buffers;
  for (ValueId v = 0; v < static_cast<ValueId>(graph.numValues()); ++v) {
    if (t.first[v] < 0 || !t.ownsMemory[v]) continue;
    int64_t size = allocatedBytes(graph.value(v));
    if (size == 0) continue;  // an empty tensor allocates nothing
    buffers.push_back(BufferAssignment{v, 0, size, t.first[v], t.last[v]});
  }
  std::sort(buffers.begin(), buffers.end(), [](const BufferAssignment& a, const BufferAssignment& b) {
    return std::tie(a.first, a.value) < std::tie(b.first, b.value);
  });
  return buffers;
}

bool lifetimesOverlap(const BufferAssignment& a, const BufferAssignment& b) {
  return a.first <= b.last && b.first <= a.last;
}

// Greedy by size: the largest buffers are placed first, each at the lowest
// offset that clashes with no placed buffer alive at the same time.
void assignOffsets(std::vector<BufferAssignment>& buffers) {
  std::vector<size_t> order(buffers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const auto& a = buffers[x];
    const auto& b = buffers[y];
    return std::make_tuple(-a.bytes, a.first, a.value) < std::make_tuple(-b.bytes, b.first, b.value);
  });
  std::vector<size_t> placed;
  for (size_t index : order) {
    BufferAssignment& buffer = buffers[index];
    std::vector<const BufferAssignment*> clashing;
    for (size_t p : placed) {
      if (lifetimesOverlap(buffers[p], buffer)) clashing.push_back(&buffers[p]);
    }
    std::sort(clashing.begin(), clashing.end(),
              [](const BufferAssignment* a, const BufferAssignment* b) { return a->offset < b->offset; });
    int64_t offset = 0;
    for (const BufferAssignment* other : clashing) {
      if (offset + buffer.bytes <= other->offset) break;  // fits in the gap below `other`
      offset = std::max(offset, other->offset + other->bytes);
    }
    buffer.offset = offset;
    placed.push_back(index);
  }
}

// Bytes live at the busiest node, by a sweep over lifetime ends.
int64_t maxLiveBytes(const std::vector<BufferAssignment>& buffers, size_t numNodes) {
  std::vector<int64_t> delta(numNodes + 1, 0);
  for (const auto& b : buffers) {
    delta[b.first] += b.bytes;
    delta[b.last + 1] -= b.bytes;
  }
  int64_t live = 0;
  int64_t most = 0;
  for (int64_t d : delta) {
    live += d;
    most = std::max(most, live);
  }
  return most;
}

std::string formatFixed(double x, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, x);
  return text;
}

}  // namespace

MemoryPlan planMemory(const Graph& graph) {
  MemoryPlan plan;
  plan.buffers = ownedBuffers(graph, computeLifetimes(graph));
  assignOffsets(plan.buffers);
  for (const auto& b : plan.buffers) {
    plan.peakBytes = std::max(plan.peakBytes, b.offset + b.bytes);
    plan.unplannedBytes += b.bytes;
  }
  plan.liveBytesBound = maxLiveBytes(plan.buffers, graph.nodes().size());
  for (const GraphInput& in : graph.inputs()) plan.inputBytes += allocatedBytes(graph.value(in.value));
  return plan;
}

ModelStateBytes modelStateBytes(const Graph& graph) {
  ModelStateBytes out;
  for (const GraphInput& in : graph.inputs()) {
    const Value& v = graph.value(in.value);
    if (in.kind == InputKind::Parameter) out.parameters += bytes(v);
    if (in.kind == InputKind::State && optimizerStateOf(v.name)) out.optimizerState += bytes(v);
  }
  for (const Gradient& grad : graph.gradients()) {
    const ValueId held = grad.reduced != kNoValue ? grad.reduced : grad.value;
    if (held != kNoValue) out.gradients += bytes(graph.value(held));
  }
  return out;
}

namespace {

std::string modelStateLine(const Graph& graph) {
  const ModelStateBytes m = modelStateBytes(graph);
  std::ostringstream out;
  out << "model state per rank: parameters " << m.parameters << " bytes, gradients " << m.gradients
      << " bytes, optimizer state " << m.optimizerState << " bytes";
  const TrainingConfig& t = graph.training();
  if (t.shard != ShardMode::None) out << " (--shard " << shardModeName(t.shard) << " over " << t.worldSize << " ranks)";
  return out.str() + "\n";
}

// What the forward keeps for the backward: buffers a forward node makes
// and a backward node reads last (directly or through a view), and the
// results of recompute-pointwise's copies of forward ops (named
// <value>.recomputed; a copy a generated kernel took in has no result of
// its own).
struct KeptForBackward {
  int64_t buffers = 0;
  int64_t bytes = 0;
  int64_t recomputed = 0;
};

KeptForBackward keptForBackward(const Graph& graph, const MemoryPlan& plan) {
  KeptForBackward k;
  const auto& nodes = graph.nodes();
  for (const BufferAssignment& b : plan.buffers) {
    const bool placed = b.first >= 0 && b.last >= b.first && static_cast<size_t>(b.last) < nodes.size();
    if (placed && nodes[b.first].meta.role == NodeRole::Forward && nodes[b.last].meta.role == NodeRole::Backward) {
      ++k.buffers;
      k.bytes += b.bytes;
    }
  }
  static const std::string suffix = ".recomputed";
  for (const Node& n : nodes) {
    if (n.meta.role != NodeRole::Backward) continue;
    for (ValueId v : n.outputs) {
      if (v != kNoValue) k.recomputed += graph.value(v).name.find(suffix) != std::string::npos;
    }
  }
  return k;
}

std::string keptForBackwardLine(const Graph& graph, const MemoryPlan& plan) {
  const KeptForBackward k = keptForBackward(graph, plan);
  std::ostringstream out;
  out << "kept from the forward for the backward: " << k.buffers << " buffers, " << k.bytes << " bytes ("
      << formatFixed(k.bytes / 1048576.0, 2) << " MiB); results computed again in the backward: " << k.recomputed
      << "\n";
  return out.str();
}

}  // namespace

ValueId memoryBaseOf(const Graph& graph, ValueId v) {
  for (const Node* p = graph.producer(v); p; p = graph.producer(v)) {
    const auto& outs = p->outputs;
    const size_t k = static_cast<size_t>(std::find(outs.begin(), outs.end(), v) - outs.begin());
    const ValueId base = outputAliasing(*p).at(k).base;
    if (base == kNoValue) break;
    v = base;
  }
  return v;
}

bool makesViewsOnly(const Node& node) {
  const std::vector<OutputAliasing> aliasing = outputAliasing(node);
  return !aliasing.empty() && std::all_of(aliasing.begin(), aliasing.end(), [](const OutputAliasing& a) {
    return a.base != kNoValue && !a.ownsMemory;
  });
}

std::string printMemoryPlan(const Graph& graph, const MemoryPlan& plan) {
  const double savedPercent =
      plan.unplannedBytes == 0 ? 0.0 : 100.0 * (plan.unplannedBytes - plan.peakBytes) / plan.unplannedBytes;
  std::ostringstream out;
  out << "memory plan: " << plan.buffers.size() << " buffers, peak " << plan.peakBytes << " bytes ("
      << formatFixed(plan.peakBytes / 1048576.0, 2) << " MiB), live-bytes bound " << plan.liveBytesBound
      << ", without reuse " << plan.unplannedBytes << " bytes (saves " << formatFixed(savedPercent, 1)
      << "%), inputs " << plan.inputBytes << " bytes\n";
  out << modelStateLine(graph);
  if (plan.buffers.empty()) return out.str();
  out << keptForBackwardLine(graph, plan);

  // The largest buffers, in the order the planner placed them.
  std::vector<BufferAssignment> largest = plan.buffers;
  std::sort(largest.begin(), largest.end(), [](const BufferAssignment& a, const BufferAssignment& b) {
    return std::make_tuple(-a.bytes, a.first, a.value) < std::make_tuple(-b.bytes, b.first, b.value);
  });
  largest.resize(std::min<size_t>(largest.size(), 10));
  size_t width = 5;  // "value"
  for (const auto& b : largest) width = std::max(width, graph.value(b.value).name.size() + 1);
  out << "largest buffers:\n";
  out << "  " << std::left << std::setw(width) << "value" << std::right << std::setw(12) << "bytes" << std::setw(12)
      << "offset" << "  lifetime\n";
  for (const auto& b : largest) {
    out << "  " << std::left << std::setw(width) << ("%" + graph.value(b.value).name) << std::right << std::setw(12)
        << b.bytes << std::setw(12) << b.offset << "  [" << b.first << ", " << b.last << "]\n";
  }
  return out.str();
}

std::string printMemoryPlanJson(const Graph& graph, const MemoryPlan& plan) {
  std::string out = "{\n";
  out += "  \"peak_bytes\": " + std::to_string(plan.peakBytes) + ",\n";
  out += "  \"live_bytes_bound\": " + std::to_string(plan.liveBytesBound) + ",\n";
  out += "  \"unplanned_bytes\": " + std::to_string(plan.unplannedBytes) + ",\n";
  out += "  \"input_bytes\": " + std::to_string(plan.inputBytes) + ",\n";
  const ModelStateBytes m = modelStateBytes(graph);
  out += "  \"model_state\": {\"parameters\": " + std::to_string(m.parameters) + ", \"gradients\": " +
         std::to_string(m.gradients) + ", \"optimizer_state\": " + std::to_string(m.optimizerState) + "},\n";
  const KeptForBackward k = keptForBackward(graph, plan);
  out += "  \"kept_for_backward\": {\"buffers\": " + std::to_string(k.buffers) + ", \"bytes\": " +
         std::to_string(k.bytes) + ", \"recomputed_values\": " + std::to_string(k.recomputed) + "},\n";
  out += "  \"buffers\": [";
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const auto& b = plan.buffers[i];
    out += std::string(i ? "," : "") + "\n    {\"name\": " + nlohmann::json(graph.value(b.value).name).dump() +
           ", \"bytes\": " + std::to_string(b.bytes) + ", \"offset\": " + std::to_string(b.offset) +
           ", \"first\": " + std::to_string(b.first) + ", \"last\": " + std::to_string(b.last) + "}";
  }
  out += plan.buffers.empty() ? "]\n" : "\n  ]\n";
  return out + "}\n";
}

}  // namespace spmd
