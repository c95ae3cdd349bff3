#include "spmd/ir/printer.h"

#include "spmd/ir/shard_layout.h"

#include "spmd/ops/dtype.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

namespace spmd {

std::string typeText(const Value& v) {
  std::string s = dtypeShortName(v.dtype) + "[";
  for (size_t i = 0; i < v.shape.size(); ++i) s += (i ? "," : "") + std::to_string(v.shape[i]);
  return s + "]";
}

namespace {

template <typename T, typename F>
std::string listText(const std::vector<T>& items, F&& each) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + each(items[i]);
  return s + "]";
}

// A double-quoted string that parser.cpp reads back: \" \\ \n \t \r \xHH.
std::string quotedText(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          const char* hex = "0123456789abcdef";
          out += std::string("\\x") + hex[(c >> 4) & 0xf] + hex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// %conv1.weight, or %"a b" for a name with characters a bare name cannot hold.
std::string refText(const std::string& name) {
  bool bare = !name.empty();
  for (char c : name) bare = bare && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-');
  return "%" + (bare ? name : quotedText(name));
}

std::string argText(const Graph& g, const Arg& a) {
  auto ref = [&](ValueId v) { return v == kNoValue ? std::string("None") : refText(g.value(v).name); };
  switch (a.kind) {
    case Arg::Kind::Value: return ref(a.value);
    case Arg::Kind::Values: return listText(a.values, ref);
    case Arg::Kind::None: return "None";
    case Arg::Kind::Int: return std::to_string(a.i);
    case Arg::Kind::Float: return floatText(a.f);
    case Arg::Kind::Bool: return a.b ? "True" : "False";
    case Arg::Kind::Str: return quotedText(a.s);
    case Arg::Kind::Device: return "device(" + quotedText(a.s) + ")";
    case Arg::Kind::Ints: return listText(a.ints, [](int64_t i) { return std::to_string(i); });
    case Arg::Kind::Floats: return listText(a.floats, floatText);
    case Arg::Kind::Bools: return listText(a.bools, [](bool b) { return std::string(b ? "True" : "False"); });
    case Arg::Kind::DType: return "torch." + dtypeName(static_cast<c10::ScalarType>(a.i));
    case Arg::Kind::Layout: return "torch." + layoutName(a.i);
    case Arg::Kind::MemoryFormat: return "torch." + memoryFormatName(a.i);
  }
  return "?";
}

std::string metaText(const NodeMeta& m) {
  std::vector<std::string> parts;
  if (!m.source.empty()) parts.push_back(m.source);
  if (m.role != NodeRole::Unknown) parts.push_back(std::string("role=") + nodeRoleName(m.role));
  if (m.bucket >= 0) parts.push_back("bucket=" + std::to_string(m.bucket));
  if (m.partition >= 0) parts.push_back("partition=" + std::to_string(m.partition));
  if (m.iteration != IterationTag::Every) parts.push_back(std::string("iteration=") + iterationTagName(m.iteration));
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? " " : "") + parts[i];
  return s.empty() ? s : "  # " + s;
}

}  // namespace

std::string printListing(const Graph& g) {
  std::ostringstream out;
  out << "graph";
  if (!g.weights().file.empty()) {
    out << " {weights: " << g.weights().file;
    if (g.weights().format != "torchscript") out << ", format: " << g.weights().format;
    out << "}";
  }
  if (g.iters() > 0) out << " {unrolled: " << g.iters() << " iterations}";
  const std::string training = trainingText(g.training());
  if (!training.empty()) out << " {training: " << training << "}";
  if (!g.flags().empty()) out << " {flags: " << printFlags(g) << "}";
  out << "\n";
  for (const auto& in : g.inputs()) {
    const Value& v = g.value(in.value);
    out << "  input " << refText(v.name) << ": " << typeText(v) << " " << inputKindName(in.kind);
    if (in.kind == InputKind::Parameter && !in.requiresGrad) out << " frozen";
    out << "\n";
  }
  for (const auto& n : g.nodes()) {
    out << "  ";
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      out << (k ? ", " : "");
      if (n.outputs[k] == kNoValue) {
        out << "_";
        continue;
      }
      const Value& v = g.value(n.outputs[k]);
      out << refText(v.name) << ": " << typeText(v);
    }
    out << " = " << n.qualifiedName() << "(";
    for (size_t i = 0; i < n.args.size(); ++i) out << (i ? ", " : "") << argText(g, n.args[i]);
    out << ")" << metaText(n.meta) << "\n";
  }
  out << "  return (";
  auto ref = [&](ValueId v) { return refText(g.value(v).name); };
  for (size_t i = 0; i < g.outputs().size(); ++i) out << (i ? ", " : "") << ref(g.outputs()[i]);
  out << ")\n";
  for (const auto& u : g.updates()) {
    out << "  update " << ref(u.input) << " <- " << ref(u.value) << "\n";
  }
  for (const auto& grad : g.gradients()) {
    out << "  gradient " << ref(grad.parameter) << " = " << ref(grad.value);
    if (grad.reduced != kNoValue) out << ", reduced " << ref(grad.reduced);
    out << "\n";
  }
  // The bucket plan (spmd-split's), so that the listing loses nothing the dump has.
  for (size_t b = 0; b < g.buckets().size(); ++b) {
    out << "  bucket " << b << ": " << g.buckets()[b].bytes << " bytes (";
    const auto& params = g.buckets()[b].parameters;
    for (size_t k = 0; k < params.size(); ++k) out << (k ? ", " : "") << ref(params[k]);
    out << ")\n";
  }
  return out.str();
}

std::string printDot(const Graph& g) {
  std::ostringstream out;
  out << "digraph spmd {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n";
  std::vector<std::string> producer(g.numValues());
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Value& v = g.value(g.inputs()[i].value);
    std::string id = "in" + std::to_string(i);
    producer[g.inputs()[i].value] = id;
    out << "  " << id << " [shape=ellipse, label=\"" << v.name << "\\n" << typeText(v) << "\\n"
        << inputKindName(g.inputs()[i].kind) << "\"];\n";
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string id = "n" + std::to_string(i);
    out << "  " << id << " [shape=box, label=\"" << n.qualifiedName() << "\"];\n";
    auto edge = [&](ValueId v) {
      out << "  " << producer[v] << " -> " << id << " [label=\"" << typeText(g.value(v)) << "\"];\n";
    };
    for (const Arg& a : n.args) {
      if (a.kind == Arg::Kind::Value) edge(a.value);
      for (ValueId v : a.values) {
        if (v != kNoValue) edge(v);
      }
    }
    for (ValueId v : n.outputs) {
      if (v != kNoValue) producer[v] = id;
    }
  }
  out << "  out [shape=doubleoctagon, label=\"return\"];\n";
  for (ValueId v : g.outputs()) out << "  " << producer[v] << " -> out [label=\"" << typeText(g.value(v)) << "\"];\n";
  for (const auto& u : g.updates()) {
    out << "  " << producer[u.value] << " -> " << producer[u.input] << " [style=dashed, label=\"update\"];\n";
  }
  out << "}\n";
  return out.str();
}

namespace {

// The bytes one rank holds of a bucket's parameters in a sharded step
// (ir/shard_layout.h); -1 for a step that is not sharded.
int64_t shardBytes(const Graph& g, const Bucket& bucket) {
  const TrainingConfig& t = g.training();
  if (t.shard == ShardMode::None) return -1;
  int64_t total = 0;
  for (ValueId p : bucket.parameters) {
    Value v = g.value(p);  // under --shard parameters the input is the shard already
    if (t.shard != ShardMode::Parameters) v.shape = shardShapeOf(v.shape, t.worldSize);
    total += bytes(v);
  }
  return total;
}

}  // namespace

std::string printBuckets(const Graph& g) {
  std::ostringstream out;
  const bool sharded = g.training().shard != ShardMode::None;
  out << "bucket      bytes" << (sharded ? "  shard bytes" : "") << "  parameters\n";
  for (size_t b = 0; b < g.buckets().size(); ++b) {
    out << std::left << std::setw(6) << b << std::right << std::setw(11) << g.buckets()[b].bytes << " ";
    if (sharded) out << std::setw(12) << shardBytes(g, g.buckets()[b]) << " ";
    for (ValueId p : g.buckets()[b].parameters) out << " " << g.value(p).name;
    out << "\n";
  }
  return out.str();
}

std::string printBucketsJson(const Graph& g) {
  std::string out = "[";
  for (size_t b = 0; b < g.buckets().size(); ++b) {
    out += std::string(b ? "," : "") + "\n  {\"index\": " + std::to_string(b) +
           ", \"bytes\": " + std::to_string(g.buckets()[b].bytes) +
           (g.training().shard != ShardMode::None ? ", \"shard_bytes\": " + std::to_string(shardBytes(g, g.buckets()[b])) : "") +
           ", \"parameters\": [";
    const auto& params = g.buckets()[b].parameters;
    for (size_t k = 0; k < params.size(); ++k) out += std::string(k ? ", " : "") + "\"" + g.value(params[k]).name + "\"";
    out += "]}";
  }
  return out + (g.buckets().empty() ? "]\n" : "\n]\n");
}

std::string printStats(const Graph& g) {
  std::map<InputKind, std::pair<int64_t, int64_t>> inputs;  // count, bytes
  for (const auto& in : g.inputs()) {
    auto& entry = inputs[in.kind];
    entry.first += 1;
    entry.second += bytes(g.value(in.value));
  }
  std::map<std::string, int> byOp;
  std::map<std::string, int> byRole;
  for (const auto& n : g.nodes()) {
    byOp[n.qualifiedName()] += 1;
    byRole[n.meta.role == NodeRole::Unknown ? "(none)" : nodeRoleName(n.meta.role)] += 1;
  }
  std::ostringstream out;
  out << "nodes: " << g.nodes().size() << "\n";
  out << "inputs:\n";
  for (InputKind k : {InputKind::Data, InputKind::Parameter, InputKind::Buffer, InputKind::State, InputKind::Schedule}) {
    auto it = inputs.find(k);
    if (it == inputs.end()) continue;
    out << "  " << std::left << std::setw(10) << inputKindName(k) << std::right << std::setw(6) << it->second.first
        << "  " << it->second.second << " bytes\n";
  }
  out << "outputs: " << g.outputs().size() << "\n";
  out << "updates: " << g.updates().size() << "\n";
  out << "gradients: " << g.gradients().size() << "\n";
  size_t width = 0;
  for (const auto& [op, _] : byOp) width = std::max(width, op.size());
  out << "by op:\n";
  for (const auto& [op, count] : byOp) out << "  " << std::left << std::setw(width) << op << std::right << std::setw(6) << count << "\n";
  out << "by role:\n";
  for (const auto& [role, count] : byRole) out << "  " << std::left << std::setw(width) << role << std::right << std::setw(6) << count << "\n";
  return out.str();
}

namespace {

// `word` as the shell reads it back: quoted unless every character is safe.
std::string shellWord(const std::string& word) {
  const bool safe = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789_-+.,:=/@%") == std::string::npos;
  if (safe) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

std::string printFlags(const Graph& graph) {
  std::string line;
  for (const auto& words : graph.flags()) {
    for (const std::string& w : words) line += (line.empty() ? "" : " ") + shellWord(w);
  }
  return line;
}

}  // namespace spmd
