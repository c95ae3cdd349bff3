// TorchScript import fidelity: the imported graph, run by the reference
// interpreter, equals the module's own forward exactly on CPU, for the
// samples (oracle: LibTorch running the module) and for modules generated at
// test time (oracle: PyTorch's outputs saved by tests/modules/gen_modules.py).
#include "spmd/io/graph_json.h"
#include "spmd/io/input_spec.h"
#include "spmd/io/torch_save.h"
#include "spmd/io/torchscript.h"
#include "spmd/ir/verify.h"
#include "spmd/runtime/interpreter.h"
#include "spmd/io/weights.h"
#include "spmd/support/diagnostic.h"

#include <nlohmann/json.hpp>
#include <set>
#include <torch/script.h>
#include <torch/serialize.h>

#include <filesystem>

#include "test_support.h"

using namespace spmd;
using spmd::testing::readFile;

namespace {

struct Sample {
  std::string name;
  std::string path;
  std::vector<InputSpec> specs;
};

Sample sample(const std::string& name) {
  std::string base = std::string(SPMD_SOURCE_DIR) + "/samples/" + name;
  return {name, base + ".pt", testing::sampleSpecs(name)};
}

// Random inputs as the samples expect them: integers are token ids or
// targets below 4 (every sample's class count and vocabulary exceed that).
std::map<std::string, at::Tensor> randomInputs(const std::vector<InputSpec>& specs) {
  std::map<std::string, at::Tensor> inputs;
  for (const auto& s : specs) {
    auto opts = at::TensorOptions().dtype(s.dtype);
    inputs[s.name] = c10::isFloatingType(s.dtype) ? torch::randn(s.shape, opts) : torch::randint(0, 4, s.shape, opts);
  }
  return inputs;
}

RunResult runImported(const Graph& graph, const std::map<std::string, at::Tensor>& data) {
  auto inputs = loadWeights(graph.weights());
  for (const auto& [name, t] : data) inputs[name] = t;
  return Interpreter(graph).run(inputs);
}

void requireSameTensor(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.sizes() == want.sizes());
  REQUIRE(got.scalar_type() == want.scalar_type());
  CHECK(torch::equal(got, want));
}

std::vector<std::string> parameterNames(const Graph& g, InputKind kind) {
  std::vector<std::string> names;
  for (const auto& in : g.inputs()) {
    if (in.kind == kind) names.push_back(g.value(in.value).name);
  }
  return names;
}

}  // namespace

TEST_CASE("samples import with named_parameters() names and run exactly as forward") {
  for (const char* name : {"mlp", "lm", "cnn"}) {
    SECTION(name) {
      torch::manual_seed(1);
      Sample s = sample(name);
      Graph graph = importTorchScript(readFile(s.path), s.path, s.specs);
      REQUIRE(verifyGraph(graph).empty());

      torch::jit::Module module = torch::jit::load(s.path);
      std::vector<std::string> params, buffers;
      // Python's named_parameters() names a tied parameter once (the LM's
      // head is its token embedding); TorchScript's lists every attribute.
      std::set<const c10::TensorImpl*> seen;
      for (const auto& p : module.named_parameters()) {
        if (seen.insert(p.value.unsafeGetTensorImpl()).second) params.push_back(p.name);
      }
      for (const auto& b : module.named_buffers()) buffers.push_back(b.name);
      CHECK(parameterNames(graph, InputKind::Parameter) == params);
      CHECK(parameterNames(graph, InputKind::Buffer) == buffers);

      auto data = randomInputs(s.specs);
      std::vector<c10::IValue> args;
      for (const auto& spec : s.specs) args.emplace_back(data[spec.name]);
      at::Tensor expected = module.forward(args).toTensor();

      RunResult got = runImported(graph, data);
      requireSameTensor(got.outputs.at(0), expected, std::string(name) + " loss");
      for (const auto& b : module.named_buffers()) {
        auto it = got.updates.find(b.name);
        REQUIRE(it != got.updates.end());
        requireSameTensor(it->second, b.value, b.name);
      }

      // The JSON dump of the graph runs the same.
      Graph reread = readGraphJson(writeGraphJson(graph));
      REQUIRE(verifyGraph(reread).empty());
      requireSameTensor(runImported(reread, data).outputs.at(0), expected, std::string(name) + " loss via JSON");
    }
  }
}

TEST_CASE("modules never seen before run exactly as PyTorch ran them") {
  const std::string dir = SPMD_MODULES_DIR;
  auto manifest = nlohmann::json::parse(readFile(dir + "/manifest.json"));
  REQUIRE(manifest.size() >= 10);
  for (const auto& entry : manifest) {
    const std::string name = entry["name"];
    SECTION(name) {
      std::vector<InputSpec> specs = parseInputSpecs(entry["inputs"].get<std::vector<std::string>>());
      std::string path = dir + "/" + entry["file"].get<std::string>();
      Graph graph = importTorchScript(readFile(path), path, specs);
      REQUIRE(verifyGraph(graph).empty());
      CHECK(parameterNames(graph, InputKind::Parameter) == entry["parameters"].get<std::vector<std::string>>());
      CHECK(parameterNames(graph, InputKind::Buffer) == entry["buffers"].get<std::vector<std::string>>());

      c10::IValue expected = loadTorchSave(dir + "/" + entry["expected"].get<std::string>());
      auto dict = expected.toGenericDict();
      std::map<std::string, at::Tensor> data;
      for (const auto& item : dict.at("inputs").toGenericDict()) data[item.key().toStringRef()] = item.value().toTensor();

      RunResult got = runImported(graph, data);
      auto outputs = dict.at("outputs").toList();
      REQUIRE(got.outputs.size() == outputs.size());
      for (size_t i = 0; i < outputs.size(); ++i) {
        requireSameTensor(got.outputs[i], outputs.get(i).toTensor(), name + " output " + std::to_string(i));
      }
      auto weights = loadWeights(graph.weights());
      for (const auto& item : dict.at("buffers").toGenericDict()) {
        const std::string buffer = item.key().toStringRef();
        auto it = got.updates.find(buffer);
        // A buffer forward does not write keeps its saved value.
        at::Tensor after = it != got.updates.end() ? it->second : weights.at(buffer);
        requireSameTensor(after, item.value().toTensor(), name + " buffer " + buffer);
      }
    }
  }
}

TEST_CASE("import errors are diagnostics, not crashes") {
  Sample s = sample("mlp");
  std::string bytes = readFile(s.path);
  CHECK_THROWS_AS(importTorchScript(bytes, s.path, {}), Diagnostic);
  CHECK_THROWS_AS(importTorchScript(bytes, s.path, parseInputSpecs({"x:f32[100,100]", "y:f32[1]"})), Diagnostic);
  CHECK_THROWS_AS(importTorchScript(bytes, s.path, parseInputSpecs({"x:f32[100,7]"})), Diagnostic);
  CHECK_THROWS_AS(importTorchScript(bytes.substr(0, bytes.size() / 2), s.path, s.specs), Diagnostic);
  try {
    importTorchScript(bytes, s.path, {});
  } catch (const Diagnostic& d) {
    CHECK(d.message() == "missing --input spec for 'x'");
  }
}

TEST_CASE("a module traced on the meta device imports as one traced on CPU") {
  torch::jit::Module m("Tiny");
  m.register_parameter("w", torch::randn({8, 4}), false);
  m.register_buffer("scale", torch::ones({4}));
  // Ops with C++ meta kernels.
  m.define(R"(
def forward(self, x, t):
    h = torch.tanh(torch.matmul(x, self.w) * self.scale)
    return torch.sum(h * h) + torch.sum(t)
)");
  std::ostringstream saved;
  m.save(saved);
  const auto specs = parseInputSpecs({"x:f32[3,8]", "t:f32[3]"});
  const Graph onMeta = importTorchScript(saved.str(), "tiny.pt", specs, TraceOn::Meta);
  const Graph onCpu = importTorchScript(saved.str(), "tiny.pt", specs, TraceOn::Cpu);
  CHECK(writeGraphJson(onMeta) == writeGraphJson(onCpu));
  CHECK(writeGraphJson(importTorchScript(saved.str(), "tiny.pt", specs)) == writeGraphJson(onCpu));
}

// spmd-expand loads a module without its parameters' and buffers' values
// (the meta trace reads none). A value read from a tensor held otherwise,
// here a plain attribute and one in a list, becomes a constant of the trace:
// it must be read, and the module loaded whole.
TEST_CASE("tensor attributes other than parameters and buffers keep their values") {
  torch::jit::Module m("WithConstants");
  m.register_parameter("w", torch::randn({8, 4}), false);
  m.register_attribute("offset", c10::TensorType::get(), torch::full({}, 0.5));
  m.register_attribute("scales", c10::ListType::ofTensors(), c10::List<at::Tensor>({torch::full({}, 3.0)}));
  m.define(R"(
def forward(self, x):
    return torch.sum(torch.matmul(x, self.w)) * self.scales[0].item() + self.offset.item()
)");
  const std::string path = (std::filesystem::temp_directory_path() / "spmd-import-constants.pt").string();
  m.save(path);
  const auto specs = parseInputSpecs({"x:f32[3,8]"});
  const at::Tensor x = torch::randn({3, 8});
  const at::Tensor expected = m.forward({x}).toTensor();
  for (TraceOn on : {TraceOn::Auto, TraceOn::Meta, TraceOn::Cpu}) {
    INFO("trace on " << static_cast<int>(on));
    const Graph graph = importTorchScript(readFile(path), path, specs, on);
    REQUIRE(verifyGraph(graph).empty());
    requireSameTensor(runImported(graph, {{"x", x}}).outputs.at(0), expected, "loss");
  }
}
