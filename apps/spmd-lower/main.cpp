// spmd-lower: a train step (JSON graph dump) becomes a self-contained artifact:
// the lowering passes, every node bound to its kernel, and all its tensors.
#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/flags.h"
#include "spmd/pipelines/lower.h"
#include "spmd/pipelines/recorded_flags.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-lower";
  CLI::App app{"Lower a graph into a self-contained artifact for spmd-run."};
  app.footer("Examples:\n"
             "  spmd-lower unrolled.json -o step.spmd\n"
             "  spmd-unroll ... | spmd-lower --device cuda --cudagraphs -o step.spmd");
  std::string in = "-", out;
  std::vector<std::string> inputSpecs;
  spmd::PipelineOptions options;
  spmd::DebugOptions debug;
  app.add_option("IN", in, "JSON graph dump (or a listing, .pt2, TorchScript or an artifact), '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "artifact file to write")->required();
  spmd::addLowerFlags(app, options.lower);
  spmd::addInputSpecFlag(app, inputSpecs);
  spmd::addDebugFlags(app, debug);
  spmd::addListPassesFlag(app);
  return spmd::runTool(tool, app, argc, argv, [&] {
    spmd::DiagnosticEngine diagnostics = spmd::printingDiagnostics(tool);
    options.diagnostics = &diagnostics;
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    diagnostics.setFile(loaded.displayName);
    spmd::recordStageFlags(loaded.graph, options, spmd::Stage::Lower);
    spmd::Artifact artifact;
    try {
      artifact = spmd::lowerGraph(std::move(loaded.graph), options, debug);
    } catch (spmd::Diagnostic& d) {
      throw d.inFile(loaded.displayName);
    }
    spmd::writeArtifact(artifact, out);
    return 0;
  });
}
