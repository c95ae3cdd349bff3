// spmd-run: runs an artifact (or a graph, lowered in-process) on N ranks.
#include "spmd/driver/run.h"
#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/lower.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-run";
  CLI::App app{"Run a compiled training step on N data-parallel ranks (Gloo on CPU, NCCL on CUDA)."};
  app.footer("Examples:\n"
             "  spmd-run step.spmd --nproc 2 --steps 100 --data batches.pt --save-params params.pt\n"
             "  torchrun --nproc_per_node 2 --no_python spmd-run step.spmd   (as rank RANK of WORLD_SIZE)");
  std::string in;
  spmd::RunOptions o;
  spmd::RunFlags flags;
  std::vector<std::string> inputSpecs;
  app.add_option("IN", in, "artifact from spmd-lower, or a graph (.pt2, TorchScript, JSON, listing) to lower with defaults")->required();
  spmd::addRunFlags(app, o, flags);
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] for a TorchScript IN");

  return spmd::runTool(tool, app, argc, argv, [&] {
    spmd::finishRunFlags(flags, o);
    const auto load = [&] {
      auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
      return spmd::artifactOf(loaded, spmd::loweringDevice(o.device));
    };
    return spmd::runAsRank(tool, load, spmd::displayNameOf(in), o, flags, std::vector<std::string>(argv, argv + argc));
  });
}
