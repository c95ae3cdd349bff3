// spmd-lower: a train step (JSON graph dump) becomes a self-contained artifact.
#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/runtime/lower.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

int main(int argc, char** argv) {
  CLI::App app{"Lower a graph into a self-contained artifact for spmd-run."};
  std::string in = "-", out, device = "cpu";
  std::vector<std::string> inputSpecs;
  app.add_option("IN", in, "JSON graph dump (or TorchScript, or an artifact), '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "artifact file to write")->required();
  app.add_option("--device", device, "cpu or cuda: where spmd-run will run it")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
  return spmd::runTool("spmd-lower", app, argc, argv, [&] {
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::Artifact artifact;
    try {
      artifact = spmd::lowerGraph(std::move(loaded.graph), device);
    } catch (spmd::Diagnostic& d) {
      throw d.inFile(loaded.displayName);
    }
    spmd::writeOutput(out, spmd::writeArtifact(artifact));
    return 0;
  });
}
