// spmd-lower: a train step (JSON graph dump) becomes a self-contained artifact:
// the lowering passes, every node bound to its kernel, and all its tensors.
#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/lower.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-lower";
  CLI::App app{"Lower a graph into a self-contained artifact for spmd-run."};
  std::string in = "-", out, dumpDir;
  std::vector<std::string> inputSpecs;
  spmd::PipelineOptions options;
  bool printIr = false, noFuse = false;
  app.add_option("IN", in, "JSON graph dump (or TorchScript, or an artifact), '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "artifact file to write")->required();
  app.add_option("--device", options.lower.device, "cpu or cuda: where spmd-run will run it")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--cudagraphs", options.lower.cudagraphs, "capture the repeating iteration into a CUDA graph (CUDA only)");
  app.add_flag("--no-fuse", noFuse, "keep the optimizer's per-parameter ops (no _foreach calls)");
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
  app.add_flag("--print-ir-after-all", printIr, "print the listing after every pass on stderr");
  app.add_option("--dump-dir", dumpDir, "write NNNN.after_<pass>.txt for every pass into DIR");
  // A callback runs before CLI11 checks for the required -o.
  app.add_flag_callback("--list-passes", [] {
    std::cout << spmd::listPasses();
    throw CLI::Success();
  }, "list the passes and exit");
  return spmd::runTool(tool, app, argc, argv, [&] {
    options.lower.fuse = !noFuse;
    std::vector<std::string> notes;
    options.notes = &notes;
    spmd::DebugOptions debug;
    debug.printIrAfterAll = printIr;
    debug.dumpDir = dumpDir;
    debug.log = &std::cerr;
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::Artifact artifact;
    try {
      artifact = spmd::lowerGraph(std::move(loaded.graph), options, debug);
    } catch (spmd::Diagnostic& d) {
      throw d.inFile(loaded.displayName);
    }
    for (const auto& note : notes) std::cerr << tool << ": note: " << loaded.displayName << ": " << note << "\n";
    spmd::writeOutput(out, spmd::writeArtifact(artifact));
    return 0;
  });
}
