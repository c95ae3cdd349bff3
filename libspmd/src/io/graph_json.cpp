#include "spmd/io/graph_json.h"

#include "spmd/ops/dtype.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"
#include "spmd/support/limits.h"

#include "json_read.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <set>

namespace spmd {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

// ---- writing ---------------------------------------------------------------

// JSON has no inf or nan: those floats are written as strings.
ojson floatJson(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  return f;
}

ojson valueJson(const Graph& g, ValueId id) {
  const Value& v = g.value(id);
  return ojson{{"name", v.name}, {"dtype", dtypeName(v.dtype)}, {"shape", v.shape}};
}

ojson argJson(const Graph& g, const Arg& a) {
  ojson out = ojson::object();
  const char* key = argKindName(a.kind);
  switch (a.kind) {
    case Arg::Kind::Value: out[key] = g.value(a.value).name; break;
    case Arg::Kind::Values: {
      ojson names = ojson::array();
      for (ValueId v : a.values) {
        if (v == kNoValue) {
          names.push_back(nullptr);  // an absent element of a Tensor?[]
        } else {
          names.push_back(g.value(v).name);
        }
      }
      out[key] = names;
      break;
    }
    case Arg::Kind::None: out[key] = nullptr; break;
    case Arg::Kind::Int: out[key] = a.i; break;
    case Arg::Kind::Float: out[key] = floatJson(a.f); break;
    case Arg::Kind::Bool: out[key] = a.b; break;
    case Arg::Kind::Str:
    case Arg::Kind::Device: out[key] = a.s; break;
    case Arg::Kind::Ints: out[key] = a.ints; break;
    case Arg::Kind::Floats: {
      ojson items = ojson::array();
      for (double f : a.floats) items.push_back(floatJson(f));
      out[key] = items;
      break;
    }
    case Arg::Kind::Bools: {
      ojson items = ojson::array();
      for (bool b : a.bools) items.push_back(b);
      out[key] = items;
      break;
    }
    case Arg::Kind::DType: out[key] = dtypeName(static_cast<c10::ScalarType>(a.i)); break;
    case Arg::Kind::Layout: out[key] = layoutName(a.i); break;
    case Arg::Kind::MemoryFormat: out[key] = memoryFormatName(a.i); break;
  }
  return out;
}

ojson metaJson(const NodeMeta& m) {
  ojson out = ojson::object();
  if (!m.source.empty()) out["source"] = m.source;
  if (m.role != NodeRole::Unknown) out["role"] = nodeRoleName(m.role);
  if (m.bucket >= 0) out["bucket"] = m.bucket;
  if (m.partition >= 0) out["partition"] = m.partition;
  if (m.iteration != IterationTag::Every) out["iteration"] = iterationTagName(m.iteration);
  return out;
}

ojson nodeJson(const Graph& g, const Node& n) {
  ojson args = ojson::array();
  for (const Arg& a : n.args) args.push_back(argJson(g, a));
  ojson outs = ojson::array();
  for (ValueId v : n.outputs) outs.push_back(v == kNoValue ? ojson(nullptr) : valueJson(g, v));
  ojson out{{"op", n.qualifiedName()}, {"args", args}, {"outputs", outs}};
  ojson meta = metaJson(n.meta);
  if (!meta.empty()) out["meta"] = meta;
  return out;
}

ojson inputJson(const Graph& g, const GraphInput& in) {
  ojson out = valueJson(g, in.value);
  out["kind"] = inputKindName(in.kind);
  if (in.kind == InputKind::Parameter) out["requires_grad"] = in.requiresGrad;
  return out;
}

// One array element per line keeps diffs of dumps readable.
void writeArray(std::string& out, const char* key, const std::vector<ojson>& items, bool last) {
  out += std::string("  \"") + key + "\": [";
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i ? ",\n    " : "\n    ") + items[i].dump();
  }
  out += items.empty() ? "]" : "\n  ]";
  out += last ? "\n" : ",\n";
}

// The training config's non-default fields (ir/training.h), flat.
ojson trainingJson(const TrainingConfig& c) {
  ojson out = ojson::object();
  const LrSchedule& s = c.schedule;
  if (c.scheduled) {
    out["lr_schedule"] = lrScheduleName(s.kind);
    out["lr"] = s.lr;
    if (s.warmupSteps) out["warmup_steps"] = s.warmupSteps;
    if (s.kind == LrScheduleKind::Linear || s.kind == LrScheduleKind::Cosine) {
      out["decay_steps"] = s.decaySteps;
      out["min_lr"] = s.minLr;
    }
    if (s.kind == LrScheduleKind::Step) {
      out["step_size"] = s.stepSize;
      out["gamma"] = s.gamma;
    }
  }
  if (c.clips()) {
    out["clip_grad_norm"] = c.clipMaxNorm;
    out["clip_norm_type"] = floatJson(c.clipNormType);
  }
  if (c.microBatches != 1) out["micro_batches"] = c.microBatches;
  if (c.worldSize) out["world_size"] = c.worldSize;
  if (c.shard != ShardMode::None) out["shard"] = shardModeName(c.shard);
  return out;
}

}  // namespace

std::string writeGraphJson(const Graph& g) {
  std::string out = "{\n";
  out += "  \"format\": \"spmd-graph\",\n";
  out += "  \"version\": " + std::to_string(kGraphFormatVersion) + ",\n";
  if (!g.weights().file.empty()) {
    ojson weights{{"file", g.weights().file}, {"format", g.weights().format}};
    out += "  \"weights\": " + weights.dump() + ",\n";
  }
  if (g.iters() > 0) out += "  \"iters\": " + std::to_string(g.iters()) + ",\n";
  const ojson training = trainingJson(g.training());
  if (!training.empty()) out += "  \"training\": " + training.dump() + ",\n";
  std::vector<ojson> items;
  if (!g.flags().empty()) {
    for (const auto& words : g.flags()) items.push_back(words);
    writeArray(out, "flags", items, false);
    items.clear();
  }
  for (const auto& in : g.inputs()) items.push_back(inputJson(g, in));
  writeArray(out, "inputs", items, false);
  items.clear();
  for (const auto& n : g.nodes()) items.push_back(nodeJson(g, n));
  writeArray(out, "nodes", items, false);
  items.clear();
  for (ValueId v : g.outputs()) items.push_back(g.value(v).name);
  writeArray(out, "outputs", items, false);
  items.clear();
  for (const auto& u : g.updates()) {
    items.push_back(ojson{{"input", g.value(u.input).name}, {"value", g.value(u.value).name}});
  }
  writeArray(out, "updates", items, false);
  items.clear();
  for (const auto& grad : g.gradients()) {
    ojson item{{"parameter", g.value(grad.parameter).name}, {"value", g.value(grad.value).name}};
    if (grad.reduced != kNoValue) item["reduced"] = g.value(grad.reduced).name;
    items.push_back(item);
  }
  writeArray(out, "gradients", items, g.buckets().empty());
  if (!g.buckets().empty()) {
    items.clear();
    for (const auto& b : g.buckets()) {
      ojson names = ojson::array();
      for (ValueId p : b.parameters) names.push_back(g.value(p).name);
      items.push_back(ojson{{"bytes", b.bytes}, {"parameters", names}});
    }
    writeArray(out, "buckets", items, true);
  }
  return out + "}\n";
}

// ---- reading ---------------------------------------------------------------

namespace {

class Reader {
 public:
  Graph read(const json& doc) {
    expectObject(doc, "", {"format", "version", "weights", "iters", "training", "flags", "inputs", "nodes", "outputs",
                           "updates", "gradients", "buckets"},
                 {"format", "version", "inputs", "nodes", "outputs"});
    if (!doc["format"].is_string() || doc["format"] != "spmd-graph") {
      fail("/format", "expected \"spmd-graph\"");
    }
    if (!doc["version"].is_number_integer() || doc["version"] != kGraphFormatVersion) {
      fail("/version", "unsupported version " + briefJson(doc["version"]) + " (this build reads " +
                           std::to_string(kGraphFormatVersion) + ")");
    }
    if (doc.contains("weights")) readWeights(doc["weights"]);
    if (doc.contains("iters")) {
      if (!doc["iters"].is_number_integer() || doc["iters"] < 1) fail("/iters", "expected a positive integer");
      graph_.setIters(doc["iters"].get<int>());
    }
    if (doc.contains("training")) readTraining(doc["training"]);
    if (doc.contains("flags")) readFlags(expectArray(doc["flags"], "/flags"));
    const json& inputs = expectArray(doc["inputs"], "/inputs");
    for (size_t i = 0; i < inputs.size(); ++i) readInput(inputs[i], "/inputs/" + std::to_string(i));
    const json& nodes = expectArray(doc["nodes"], "/nodes");
    for (size_t i = 0; i < nodes.size(); ++i) readNode(nodes[i], "/nodes/" + std::to_string(i));
    const json& outputs = expectArray(doc["outputs"], "/outputs");
    for (size_t i = 0; i < outputs.size(); ++i) graph_.addOutput(ref(outputs[i], "/outputs/" + std::to_string(i)));
    if (doc.contains("updates")) {
      const json& updates = expectArray(doc["updates"], "/updates");
      for (size_t i = 0; i < updates.size(); ++i) readUpdate(updates[i], "/updates/" + std::to_string(i));
    }
    if (doc.contains("gradients")) {
      const json& grads = expectArray(doc["gradients"], "/gradients");
      for (size_t i = 0; i < grads.size(); ++i) readGradient(grads[i], "/gradients/" + std::to_string(i));
    }
    if (doc.contains("buckets")) {
      const json& buckets = expectArray(doc["buckets"], "/buckets");
      std::vector<Bucket> plan;
      for (size_t i = 0; i < buckets.size(); ++i) plan.push_back(readBucket(buckets[i], "/buckets/" + std::to_string(i)));
      graph_.setBuckets(std::move(plan));
    }
    return std::move(graph_);
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& what) {
    throw Diagnostic(where.empty() ? "/" : where, what);
  }

  void expectObject(const json& j, const std::string& where, const std::set<std::string>& allowed,
                    const std::set<std::string>& required) {
    if (!j.is_object()) fail(where, "expected an object, got " + std::string(j.type_name()));
    for (const auto& [key, _] : j.items()) {
      if (!allowed.count(key)) fail(where + "/" + echo(key), "unknown key '" + echo(key) + "'");
    }
    for (const auto& key : required) {
      if (!j.contains(key)) fail(where, "missing key '" + key + "'");
    }
  }

  const json& expectArray(const json& j, const std::string& where) {
    if (!j.is_array()) fail(where, "expected an array, got " + std::string(j.type_name()));
    return j;
  }

  std::string str(const json& j, const std::string& where) {
    if (!j.is_string()) fail(where, "expected a string, got " + std::string(j.type_name()));
    return j.get<std::string>();
  }

  int64_t integer(const json& j, const std::string& where) {
    if (!j.is_number_integer()) fail(where, "expected an integer, got " + briefJson(j));
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(where, "integer " + briefJson(j) + " does not fit in 64 bits");
    }
    return j.get<int64_t>();
  }

  // A bucket or partition number.
  int index(const json& j, const std::string& where) {
    int64_t v = integer(j, where);
    if (v < 0 || v > std::numeric_limits<int>::max()) fail(where, "expected an index >= 0, got " + briefJson(j));
    return static_cast<int>(v);
  }

  void readTraining(const json& j) {
    expectObject(j, "/training", {"lr_schedule", "lr", "warmup_steps", "decay_steps", "min_lr", "step_size", "gamma",
                                  "clip_grad_norm", "clip_norm_type", "micro_batches", "world_size", "shard"}, {});
    TrainingConfig& c = graph_.training();
    LrSchedule& s = c.schedule;
    if (j.contains("lr_schedule")) {
      c.scheduled = true;
      const std::string kind = str(j["lr_schedule"], "/training/lr_schedule");
      if (!parseLrScheduleKind(kind, s.kind)) fail("/training/lr_schedule", "unknown schedule (constant, linear, cosine, step)");
      if (!j.contains("lr")) fail("/training", "missing key 'lr' (the schedule's base learning rate)");
    }
    if (j.contains("lr")) s.lr = number(j["lr"], "/training/lr");
    if (j.contains("warmup_steps")) s.warmupSteps = integer(j["warmup_steps"], "/training/warmup_steps");
    if (j.contains("decay_steps")) s.decaySteps = integer(j["decay_steps"], "/training/decay_steps");
    if (j.contains("min_lr")) s.minLr = number(j["min_lr"], "/training/min_lr");
    if (j.contains("step_size")) s.stepSize = integer(j["step_size"], "/training/step_size");
    if (j.contains("gamma")) s.gamma = number(j["gamma"], "/training/gamma");
    if (j.contains("clip_grad_norm")) {
      c.clipMaxNorm = number(j["clip_grad_norm"], "/training/clip_grad_norm");
      if (!(c.clipMaxNorm > 0)) fail("/training/clip_grad_norm", "expected a number > 0");
    }
    if (j.contains("clip_norm_type")) c.clipNormType = number(j["clip_norm_type"], "/training/clip_norm_type");
    if (j.contains("micro_batches")) c.microBatches = integer(j["micro_batches"], "/training/micro_batches");
    if (j.contains("world_size")) {
      c.worldSize = integer(j["world_size"], "/training/world_size");
      if (c.worldSize < 1) fail("/training/world_size", "expected an integer >= 1");
    }
    if (j.contains("shard") && !parseShardMode(str(j["shard"], "/training/shard"), c.shard)) {
      fail("/training/shard", "unknown shard mode (none, optimizer, gradients, parameters)");
    }
    try {
      validateTraining(c);
    } catch (const Diagnostic& d) {
      fail("/training", d.where().substr(2) + " " + d.message());
    }
  }

  // Each element a flag's command-line words: ["--lr", "0.001"] or ["--cudagraphs"].
  void readFlags(const json& flags) {
    std::vector<std::vector<std::string>> out;
    for (size_t i = 0; i < flags.size(); ++i) {
      const std::string where = "/flags/" + std::to_string(i);
      const json& words = expectArray(flags[i], where);
      if (words.empty() || words.size() > 2) fail(where, "expected [\"--FLAG\"] or [\"--FLAG\", \"VALUE\"]");
      std::vector<std::string> flag;
      for (size_t w = 0; w < words.size(); ++w) flag.push_back(str(words[w], where + "/" + std::to_string(w)));
      if (flag[0].size() < 3 || flag[0].compare(0, 2, "--") != 0 ||
          flag[0].find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-", 2) != std::string::npos) {
        fail(where + "/0", "expected a long flag such as \"--lr\", got " + briefJson(words[0]));
      }
      out.push_back(std::move(flag));
    }
    graph_.setFlags(std::move(out));
  }

  double number(const json& j, const std::string& where) {
    if (j.is_number()) return j.get<double>();
    if (j == "inf") return std::numeric_limits<double>::infinity();
    if (j == "-inf") return -std::numeric_limits<double>::infinity();
    if (j == "nan") return std::numeric_limits<double>::quiet_NaN();
    fail(where, "expected a number, \"inf\", \"-inf\" or \"nan\", got " + briefJson(j));
  }

  ValueId ref(const json& j, const std::string& where) {
    std::string name = str(j, where);
    auto id = graph_.findValue(name);
    if (!id) fail(where, "unknown value '" + echo(name) + "'");
    return *id;
  }

  Value value(const json& j, const std::string& where, const std::set<std::string>& extraKeys) {
    std::set<std::string> allowed = {"name", "dtype", "shape"};
    allowed.insert(extraKeys.begin(), extraKeys.end());
    expectObject(j, where, allowed, {"name", "dtype", "shape"});
    Value v;
    v.name = str(j["name"], where + "/name");
    if (v.name.empty()) fail(where + "/name", "empty value name");
    if (graph_.findValue(v.name)) fail(where + "/name", "value '" + echo(v.name) + "' defined twice");
    std::string dtype = str(j["dtype"], where + "/dtype");
    auto parsed = parseDtype(dtype);
    if (!parsed) fail(where + "/dtype", "unknown dtype '" + echo(dtype) + "'");
    v.dtype = *parsed;
    const json& shape = expectArray(j["shape"], where + "/shape");
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t d = integer(shape[i], where + "/shape/" + std::to_string(i));
      if (d < 0) fail(where + "/shape/" + std::to_string(i), "negative dimension " + std::to_string(d));
      v.shape.push_back(d);
    }
    const std::string problem = shapeBoundProblem(v.shape);
    if (!problem.empty()) fail(where + "/shape", "shape with " + problem);
    return v;
  }

  void readWeights(const json& j) {
    expectObject(j, "/weights", {"file", "format"}, {"file", "format"});
    WeightsRef w{str(j["file"], "/weights/file"), str(j["format"], "/weights/format")};
    if (w.format != "torchscript" && w.format != "torch.save" && w.format != "pt2") {
      fail("/weights/format", "unknown weights format '" + echo(w.format) + "'");
    }
    graph_.setWeights(w);
  }

  void readInput(const json& j, const std::string& where) {
    Value v = value(j, where, {"kind", "requires_grad"});
    if (!j.contains("kind")) fail(where, "missing key 'kind'");
    std::string kindName = str(j["kind"], where + "/kind");
    auto kind = parseInputKind(kindName);
    if (!kind) fail(where + "/kind", "unknown input kind '" + echo(kindName) + "'");
    bool requiresGrad = *kind == InputKind::Parameter;
    if (j.contains("requires_grad")) {
      if (*kind != InputKind::Parameter) fail(where + "/requires_grad", "only parameters take requires_grad");
      if (!j["requires_grad"].is_boolean()) fail(where + "/requires_grad", "expected a boolean");
      requiresGrad = j["requires_grad"].get<bool>();
    }
    graph_.addInput(std::move(v), *kind, requiresGrad);
  }

  void readNode(const json& j, const std::string& where) {
    expectObject(j, where, {"op", "args", "outputs", "meta"}, {"op", "args", "outputs"});
    Node node;
    std::string op = str(j["op"], where + "/op");
    size_t sep = op.find("::");
    if (sep == std::string::npos || sep == 0 || sep + 2 >= op.size()) {
      fail(where + "/op", "expected a qualified operator name such as aten::relu, got '" + echo(op) + "'");
    }
    size_t dot = op.find('.', sep);
    if (dot != std::string::npos && (dot + 1 == op.size() || op.find('.', dot + 1) != std::string::npos)) {
      fail(where + "/op", "malformed overload in '" + echo(op) + "'");
    }
    node.op = op.substr(0, dot);
    node.overload = dot == std::string::npos ? "" : op.substr(dot + 1);
    const json& args = expectArray(j["args"], where + "/args");
    for (size_t i = 0; i < args.size(); ++i) node.args.push_back(arg(args[i], where + "/args/" + std::to_string(i)));
    if (j.contains("meta")) node.meta = meta(j["meta"], where + "/meta");
    const json& outs = expectArray(j["outputs"], where + "/outputs");
    for (size_t i = 0; i < outs.size(); ++i) {
      node.outputs.push_back(outs[i].is_null() ? kNoValue
                                               : graph_.addValue(value(outs[i], where + "/outputs/" + std::to_string(i), {})));
    }
    graph_.addNode(std::move(node));
  }

  Arg arg(const json& j, const std::string& where) {
    if (!j.is_object() || j.size() != 1) fail(where, "expected an object with exactly one key, such as {\"value\": \"x\"}");
    const auto item = j.begin();
    const std::string key = item.key();
    const json& v = *item;
    const std::string at = where + "/" + echo(key);
    Arg a;
    if (key == "value") return Arg::tensor(ref(v, at));
    if (key == "none") {
      if (!v.is_null()) fail(at, "expected null");
      return Arg::none();
    }
    if (key == "int") return Arg::ofInt(integer(v, at));
    if (key == "float") return Arg::ofFloat(number(v, at));
    if (key == "bool") {
      if (!v.is_boolean()) fail(at, "expected a boolean");
      return Arg::ofBool(v.get<bool>());
    }
    if (key == "str" || key == "device") {
      a.kind = key == "str" ? Arg::Kind::Str : Arg::Kind::Device;
      a.s = str(v, at);
      return a;
    }
    if (key == "values" || key == "ints" || key == "floats" || key == "bools") {
      expectArray(v, at);
      for (size_t i = 0; i < v.size(); ++i) {
        std::string item = at + "/" + std::to_string(i);
        if (key == "values") a.values.push_back(v[i].is_null() ? kNoValue : ref(v[i], item));
        if (key == "ints") a.ints.push_back(integer(v[i], item));
        if (key == "floats") a.floats.push_back(number(v[i], item));
        if (key == "bools") {
          if (!v[i].is_boolean()) fail(item, "expected a boolean");
          a.bools.push_back(v[i].get<bool>());
        }
      }
      a.kind = key == "values" ? Arg::Kind::Values
               : key == "ints" ? Arg::Kind::Ints
               : key == "floats" ? Arg::Kind::Floats
                                 : Arg::Kind::Bools;
      return a;
    }
    if (key == "dtype") {
      auto t = parseDtype(str(v, at));
      if (!t) fail(at, "unknown dtype " + briefJson(v));
      a.kind = Arg::Kind::DType;
      a.i = static_cast<int64_t>(*t);
      return a;
    }
    if (key == "layout" || key == "memory_format") {
      const std::string name = str(v, at);
      auto parsed = key == "layout" ? parseLayout(name) : parseMemoryFormat(name);
      if (!parsed) fail(at, "unknown " + key + " '" + echo(name) + "'");
      a.kind = key == "layout" ? Arg::Kind::Layout : Arg::Kind::MemoryFormat;
      a.i = *parsed;
      return a;
    }
    fail(at, "unknown argument kind '" + echo(key) + "'");
  }

  NodeMeta meta(const json& j, const std::string& where) {
    expectObject(j, where, {"source", "role", "bucket", "partition", "iteration"}, {});
    NodeMeta m;
    if (j.contains("source")) m.source = str(j["source"], where + "/source");
    if (j.contains("role")) {
      const std::string role = str(j["role"], where + "/role");
      auto parsed = parseNodeRole(role);
      if (!parsed) fail(where + "/role", "expected forward, backward, optimizer or comm, got \"" + echo(role) + "\"");
      m.role = *parsed;
    }
    if (j.contains("bucket")) m.bucket = index(j["bucket"], where + "/bucket");
    if (j.contains("partition")) m.partition = index(j["partition"], where + "/partition");
    if (j.contains("iteration")) {
      const std::string tag = str(j["iteration"], where + "/iteration");
      auto parsed = parseIterationTag(tag);
      if (!parsed) fail(where + "/iteration", "expected \"previous\" or \"last\", got \"" + echo(tag) + "\"");
      m.iteration = *parsed;
    }
    return m;
  }

  void readUpdate(const json& j, const std::string& where) {
    expectObject(j, where, {"input", "value"}, {"input", "value"});
    StateUpdate u{ref(j["input"], where + "/input"), ref(j["value"], where + "/value")};
    graph_.addUpdate(u);
  }

  Bucket readBucket(const json& j, const std::string& where) {
    expectObject(j, where, {"bytes", "parameters"}, {"bytes", "parameters"});
    Bucket b;
    b.bytes = integer(j["bytes"], where + "/bytes");
    const json& params = expectArray(j["parameters"], where + "/parameters");
    for (size_t i = 0; i < params.size(); ++i) {
      std::string at = where + "/parameters/" + std::to_string(i);
      ValueId p = ref(params[i], at);
      const GraphInput* input = graph_.inputOf(p);
      if (!input || input->kind != InputKind::Parameter) fail(at, "'" + echo(graph_.value(p).name) + "' is not a parameter input");
      b.parameters.push_back(p);
    }
    return b;
  }

  void readGradient(const json& j, const std::string& where) {
    expectObject(j, where, {"parameter", "value", "reduced"}, {"parameter", "value"});
    ValueId parameter = ref(j["parameter"], where + "/parameter");
    const GraphInput* input = graph_.inputOf(parameter);
    if (!input || input->kind != InputKind::Parameter) {
      fail(where + "/parameter", "'" + echo(graph_.value(parameter).name) + "' is not a parameter input");
    }
    Gradient gradient{parameter, ref(j["value"], where + "/value")};
    if (j.contains("reduced")) gradient.reduced = ref(j["reduced"], where + "/reduced");
    graph_.addGradient(gradient);
  }

  Graph graph_;
};

}  // namespace

Graph readGraphJson(const std::string& text) { return Reader().read(parseJson(text)); }

}  // namespace spmd
