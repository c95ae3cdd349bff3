// spmd-unroll: IterGraphModule's unrolling of a train step into setup, main
// and cleanup iterations, with the last bucket's all-reduce and optimizer
// update moved into the next iteration; written as a JSON graph dump.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/flags.h"
#include "spmd/pipelines/recorded_flags.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-unroll";
  CLI::App app{"Unroll a train step into setup, main and cleanup iterations (IterGraphModule)."};
  app.footer("Examples:\n"
             "  spmd-unroll split.json --iters 100 -o unrolled.json\n"
             "  spmd-split ... | spmd-unroll --iters 10 | spmd-lower -o step.spmd");
  std::string in = "-", out = "-";
  std::vector<std::string> inputSpecs;
  spmd::PipelineOptions options;
  spmd::DebugOptions debug;
  app.add_option("IN", in, "JSON graph dump (spmd-split's, or any train step), listing, .pt2 or TorchScript, '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "output JSON graph dump, '-' for stdout")->capture_default_str();
  spmd::addInputSpecFlag(app, inputSpecs);
  spmd::addUnrollFlags(app, options.unroll);
  spmd::addDebugFlags(app, debug);

  return spmd::runTool(tool, app, argc, argv, [&] {
    spmd::DiagnosticEngine diagnostics = spmd::printingDiagnostics(tool);
    options.diagnostics = &diagnostics;
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::recordStageFlags(loaded.graph, options, spmd::Stage::Unroll);
    spmd::runStage(loaded, spmd::unrollPipeline(options), options, debug);
    spmd::writeOutput(out, spmd::writeGraphJson(loaded.graph));
    return 0;
  });
}
