// Train steps exported from Python with spmd_export (make_fx) against
// PyTorch's own eager loop: loaded from their JSON dumps, put through
// grad-sync as spmd does with any train step, and run by the interpreter
// for S steps, they must give PyTorch's losses, parameters and buffers.
#include "spmd/io/graph_json.h"
#include "spmd/io/torch_save.h"
#include "spmd/ir/verify.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"
#include "spmd/io/weights.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "test_support.h"

using namespace spmd;
using spmd::testing::readFile;

namespace {

std::map<std::string, at::Tensor> tensorDict(const c10::IValue& v) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : v.toGenericDict()) out[item.key().toStringRef()] = item.value().toTensor();
  return out;
}

void requireClose(const at::Tensor& ours, const at::Tensor& ref, const std::string& what) {
  testing::requireClose(ours, ref, what, 1e-5, 1e-6);
}

}  // namespace

TEST_CASE("exported train steps train in lockstep with eager PyTorch", "[export]") {
  const std::string dir = SPMD_EXPORTS_DIR;
  auto manifest = nlohmann::json::parse(readFile(dir + "/manifest.json"));
  REQUIRE(manifest.size() >= 3);
  for (const auto& entry : manifest) {
    const std::string name = entry["name"];
    SECTION(name) {
      Graph graph = readGraphJson(readFile(dir + "/" + entry["dump"].get<std::string>()));
      REQUIRE(verifyGraph(graph).empty());
      REQUIRE_FALSE(graph.gradients().empty());
      runPasses(graph, {"grad-sync"}, PipelineOptions{}, DebugOptions{});
      for (const auto& g : graph.gradients()) CHECK(g.reduced != kNoValue);

      auto expected = loadTorchSave(dir + "/" + entry["expected"].get<std::string>()).toGenericDict();
      auto batches = tensorDict(expected.at("batches"));
      at::Tensor losses = expected.at("losses").toTensor();
      std::map<std::string, at::Tensor> state = loadWeights(graph.weights());
      Interpreter interpreter(graph);
      const int steps = entry["steps"];
      for (int s = 0; s < steps; ++s) {
        std::map<std::string, at::Tensor> inputs = state;
        for (const auto& [input, stacked] : batches) inputs[input] = stacked[s];
        RunResult got = interpreter.run(inputs);
        for (const auto& [target, value] : got.updates) state[target] = value;
        requireClose(got.outputs.at(0), losses[s], name + " loss at step " + std::to_string(s));
      }
      for (const auto& [param, value] : tensorDict(expected.at("params"))) requireClose(state.at(param), value, param);
      for (const auto& [buffer, value] : tensorDict(expected.at("buffers"))) requireClose(state.at(buffer), value, buffer);
    }
  }
}
