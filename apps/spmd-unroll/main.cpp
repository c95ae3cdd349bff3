// spmd-unroll: IterGraphModule's unrolling of a train step into setup, main
// and cleanup iterations, with the last bucket's all-reduce and optimizer
// update moved into the next iteration; written as a JSON graph dump.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-unroll";
  CLI::App app{"Unroll a train step into setup, main and cleanup iterations (IterGraphModule)."};
  std::string in = "-", out = "-", dumpDir;
  std::vector<std::string> inputSpecs;
  spmd::PipelineOptions options;
  bool printIr = false, noMove = false;
  app.add_option("IN", in, "JSON graph dump (spmd-split's, or any train step), '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "output JSON graph dump, '-' for stdout")->capture_default_str();
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
  app.add_option("--iters", options.unroll.iters, "iterations the artifact runs (spmd-run's default --steps)")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_flag("--no-move", noMove, "move nothing across iterations");
  app.add_flag("--print-ir-after-all", printIr, "print the listing after every pass on stderr");
  app.add_option("--dump-dir", dumpDir, "write NNNN.after_<pass>.txt for every pass into DIR");

  return spmd::runTool(tool, app, argc, argv, [&] {
    options.unroll.move = !noMove;
    std::vector<std::string> notes;
    options.notes = &notes;
    spmd::DebugOptions debug;
    debug.printIrAfterAll = printIr;
    debug.dumpDir = dumpDir;
    debug.log = &std::cerr;
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::runStage(loaded, spmd::unrollPipeline(options), options, debug);
    for (const auto& note : notes) std::cerr << tool << ": note: " << loaded.displayName << ": " << note << "\n";
    spmd::writeOutput(out, spmd::writeGraphJson(loaded.graph));
    return 0;
  });
}
