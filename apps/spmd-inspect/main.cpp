// spmd-inspect: prints a TorchScript module, a JSON graph dump or an artifact.
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/analysis/kernels.h"
#include "spmd/analysis/memory_plan.h"
#include "spmd/ir/printer.h"
#include "spmd/ir/verify.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-inspect";
  CLI::App app{"Print an spmd graph: a TorchScript module, a JSON graph dump or an artifact."};
  app.footer("Examples:\n"
             "  spmd-inspect samples/mlp.pt --input x:f32[100,100]\n"
             "  spmd-inspect step.json --verify\n"
             "  spmd-inspect step.spmd --buckets --json\n"
             "  spmd-inspect step.art --kernels --source\n"
             "  spmd-expand ... | spmd-inspect - --stats");
  std::string in = "-";
  std::string out = "-";
  std::vector<std::string> inputSpecs;
  bool verify = false;
  app.add_option("IN", in, "any graph (.pt2, TorchScript, JSON graph dump, listing) or artifact, '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "output file, '-' for stdout")->capture_default_str();
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
  app.add_flag("--verify", verify, "verify the graph; list every problem and exit 1 if there is any");
  auto* stats = app.add_flag("--stats", "node counts by op and role, parameter bytes");
  auto* dot = app.add_flag("--dot", "Graphviz digraph");
  auto* json = app.add_flag("--json",
                            "the canonical JSON graph dump (with --buckets or --memory: that table as JSON)");
  auto* buckets = app.add_flag("--buckets", "the bucket table spmd-split made: index, bytes, parameters");
  auto* memory = app.add_flag("--memory",
                              "the static memory plan: peak and live bytes, the largest buffers with offsets and "
                              "lifetimes (with --json: every buffer)");
  auto* kernels = app.add_flag("--kernels",
                               "the generated kernels spmd-lower made (spmd::fused nodes, gemm attention's softmax): ops, inputs, outputs, bytes moved");
  auto* sources = app.add_flag("--source", "with --kernels: each kernel's CUDA source too")->needs(kernels);
  auto* flags = app.add_flag("--flags",
                             "the flags the stages recorded, as one command line (spmd-compile takes them back); "
                             "exit 1 when the graph records none");
  flags->excludes(stats)->excludes(dot)->excludes(json)->excludes(buckets)->excludes(memory)->excludes(kernels);
  stats->excludes(dot)->excludes(json)->excludes(buckets)->excludes(memory)->excludes(kernels);
  dot->excludes(json)->excludes(buckets)->excludes(memory)->excludes(kernels);
  buckets->excludes(memory)->excludes(kernels);
  memory->excludes(kernels);

  return spmd::runTool(tool, app, argc, argv, [&] {
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    auto problems = spmd::verifyGraph(loaded.graph);
    if (!problems.empty()) {
      if (!verify) throw spmd::Diagnostic(problems[0].where, problems[0].what).inFile(loaded.displayName);
      for (const auto& p : problems) spmd::printError(tool, loaded.displayName + ": " + p.where + ": " + p.what);
      return 1;
    }
    std::string text;
    if (*buckets) {
      if (loaded.graph.buckets().empty()) {
        throw spmd::Diagnostic("", "the graph has no bucket plan; run spmd-split first").inFile(loaded.displayName);
      }
      text = *json ? spmd::printBucketsJson(loaded.graph) : spmd::printBuckets(loaded.graph);
    } else if (*kernels) {
      std::vector<spmd::FusedKernel> list;
      try {
        list = spmd::fusedKernels(loaded.graph);
      } catch (spmd::Diagnostic& d) {
        throw d.inFile(loaded.displayName);
      }
      text = *json ? spmd::printKernelsJson(loaded.graph, list, static_cast<bool>(*sources))
                   : spmd::printKernels(loaded.graph, list, static_cast<bool>(*sources));
    } else if (*flags) {
      text = spmd::printFlags(loaded.graph);
      if (text.empty()) {
        throw spmd::Diagnostic("", "the graph records no flags (written before the stages recorded them, or by "
                                   "spmd-opt)").inFile(loaded.displayName);
      }
      text += "\n";
    } else if (*memory) {
      auto plan = spmd::planMemory(loaded.graph);
      text = *json ? spmd::printMemoryPlanJson(loaded.graph, plan) : spmd::printMemoryPlan(loaded.graph, plan);
    } else if (*json) {
      text = spmd::writeGraphJson(loaded.graph);
    } else if (*dot) {
      text = spmd::printDot(loaded.graph);
    } else if (*stats) {
      text = spmd::printStats(loaded.graph);
    } else if (verify) {
      text = loaded.displayName + ": verified " + std::to_string(loaded.graph.nodes().size()) + " nodes\n";
    } else {
      text = spmd::printListing(loaded.graph);
    }
    spmd::writeOutput(out, text);
    return 0;
  });
}
