// spmd-split: DDP's bucketing applied to a train step (or a forward graph):
// one flat all-reduce per bucket, written as a JSON graph dump.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-split";
  CLI::App app{"Bucket a train step's gradients as DDP does: one flat all-reduce per bucket."};
  std::string in = "-", out = "-", gradReduce = "mean", dumpDir;
  std::vector<std::string> inputSpecs;
  spmd::PipelineOptions options;
  bool printIr = false;
  app.add_option("IN", in, "JSON graph dump (spmd-expand's or spmd_export's) or TorchScript, '-' for stdin")
      ->capture_default_str();
  app.add_option("-o,--output", out, "output JSON graph dump, '-' for stdout")->capture_default_str();
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
  app.add_option("--bucket-cap-mb", options.buckets.capMb, "bucket capacity in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--first-bucket-cap-mb", options.buckets.firstCapMb, "capacity of the first bucket filled (the last in forward order)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--ignore-param", options.buckets.ignored, "a parameter DDP ignores: never bucketed, never synced");
  app.add_option("--grad-reduce", gradReduce, "for dumps without gradient sync yet: mean (DDP) or sum")
      ->check(CLI::IsMember({"mean", "sum"}))
      ->capture_default_str();
  app.add_flag("--print-ir-after-all", printIr, "print the listing after every pass on stderr");
  app.add_option("--dump-dir", dumpDir, "write NNNN.after_<pass>.txt for every pass into DIR");

  return spmd::runTool(tool, app, argc, argv, [&] {
    options.gradReduce = gradReduce == "sum" ? spmd::GradReduce::Sum : spmd::GradReduce::Mean;
    spmd::DebugOptions debug;
    debug.printIrAfterAll = printIr;
    debug.dumpDir = dumpDir;
    debug.log = &std::cerr;
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::runStage(loaded, spmd::splitPipeline(options), options, debug);
    spmd::writeOutput(out, spmd::writeGraphJson(loaded.graph));
    return 0;
  });
}
