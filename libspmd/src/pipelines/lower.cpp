#include "spmd/pipelines/pipelines.h"
#include "spmd/pipelines/lower.h"

#include "spmd/ir/shard_layout.h"

#include "spmd/analysis/kernels.h"
#include "spmd/ir/verify.h"
#include "spmd/backend/generated_kernels.h"
#include "spmd/support/phase_times.h"
#include "spmd/io/weights.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <set>

namespace spmd {

namespace {

// Factory calls traced on CPU (aten::arange(..., device="cpu")) create their
// tensors where the step runs: "cuda" is the rank's current device.
void targetDevice(Graph& graph, const std::string& device) {
  for (const Node& n : graph.nodes()) {
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (n.args[i].kind == Arg::Kind::Device) graph.constantArg(n, i).s = device;
    }
  }
}

// Each distinct generated kernel's source, compiled for this machine's GPU
// when it has one; else left for spmd-run to compile at its first launch.
std::vector<CompiledKernel> compileKernels(const Graph& graph, DiagnosticEngine* diagnostics) {
  TimedPhase phase("compile kernels");
  std::vector<CompiledKernel> kernels;
  std::set<std::string> seen;
  const bool gpu = canCompileKernels();
  for (const FusedKernel& k : fusedKernels(graph)) {
    if (!seen.insert(k.key).second) continue;  // equal keys, equal sources
    if (!gpu) {
      kernels.push_back({k.source, "", ""});
      continue;
    }
    try {
      kernels.push_back(compileKernel(k.source));
    } catch (const std::runtime_error& e) {
      throw Diagnostic("/nodes/" + std::to_string(k.node), e.what());
    }
  }
  if (!gpu && !kernels.empty() && diagnostics) {
    diagnostics->note("no GPU here: the " + std::to_string(kernels.size()) +
                      " distinct generated kernel(s) are stored as source; spmd-run compiles each at its first launch");
  }
  return kernels;
}

}  // namespace

Artifact lowerGraph(Graph graph, const std::string& device) {
  PipelineOptions options;
  options.lower.device = device;
  return lowerGraph(std::move(graph), options);
}

Artifact artifactOf(LoadedGraph& loaded, const std::string& device) {
  if (loaded.artifact) return *loaded.artifact;
  try {
    return lowerGraph(std::move(loaded.graph), device);
  } catch (Diagnostic& d) {
    throw d.inFile(loaded.displayName);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw Diagnostic("", "cannot lower it: " + what.substr(0, what.find('\n'))).inFile(loaded.displayName);
  }
}

Artifact lowerGraph(Graph graph, const PipelineOptions& options, const DebugOptions& debug) {
  const std::string& device = options.lower.device;
  if (device != "cpu" && device != "cuda") throw Diagnostic("--device", "expected cpu or cuda, got '" + device + "'");
  verifyGraphOrThrow(graph);
  if (options.lower.cudagraphs && device != "cuda" && options.diagnostics) {
    options.diagnostics->note("--cudagraphs: CUDA graphs need --device cuda; the step runs eagerly");
  }
  runPasses(graph, lowerPipeline(options), options, debug);
  
  Artifact artifact;
  artifact.device = device;
  artifact.cudagraphs = options.lower.cudagraphs && device == "cuda";
  std::map<std::string, at::Tensor> weights;
  bool needsWeights = false;
  for (const auto& in : graph.inputs()) needsWeights = needsWeights || in.kind == InputKind::Parameter || in.kind == InputKind::Buffer;
  if (needsWeights) {
    if (graph.weights().file.empty()) throw Diagnostic("/weights", "the graph references no weights file");
    weights = loadWeights(graph.weights());
  }
  for (const auto& in : graph.inputs()) {
    if (isPerStepInput(in.kind)) continue;
    const Value& v = graph.value(in.value);
    auto it = weights.find(v.name);
    if (it == weights.end()) {
      if (in.kind != InputKind::State) {
        throw Diagnostic("'" + v.name + "'", "not in the weights file " + graph.weights().file);
      }
      artifact.state[v.name] = zeroPlaceholder(v.shape, v.dtype);
      artifact.zeroState.insert(v.name);
      continue;
    }
    const at::Tensor& t = it->second;
    // A sharded step's input takes the whole tensor: each rank cuts its shard at the start of a run.
    const bool whole = isShardOf(v.shape, t.sizes().vec(), graph.training().worldSize);
    if ((t.sizes() != c10::IntArrayRef(v.shape) && !whole) || t.scalar_type() != v.dtype) {
      throw Diagnostic("'" + v.name + "'", "the weights file holds a tensor of another shape or dtype");
    }
    artifact.state[v.name] = t.detach();  // the weights file's own tensor: nothing else holds it
  }
  targetDevice(graph, device);
  if (device == "cuda") artifact.kernels = compileKernels(graph, options.diagnostics);
  artifact.graph = std::move(graph);
  return artifact;
}

}  // namespace spmd
