// spmd-split: DDP's bucketing applied to a train step (or a forward graph):
// one flat all-reduce per bucket, written as a JSON graph dump.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/flags.h"
#include "spmd/pipelines/recorded_flags.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

int main(int argc, char** argv) {
  const std::string tool = "spmd-split";
  CLI::App app{"Bucket a train step's gradients as DDP does: one flat all-reduce per bucket."};
  app.footer("Examples:\n"
             "  spmd-split step.json --bucket-cap-mb 25 -o split.json\n"
             "  spmd-expand ... | spmd-split | spmd-unroll");
  std::string in = "-", out = "-";
  std::vector<std::string> inputSpecs;
  spmd::PipelineOptions options;
  spmd::DebugOptions debug;
  app.add_option("IN", in, "JSON graph dump (spmd-expand's or spmd_export's), listing, .pt2 or TorchScript, '-' for stdin")
      ->capture_default_str();
  app.add_option("-o,--output", out, "output JSON graph dump, '-' for stdout")->capture_default_str();
  spmd::addInputSpecFlag(app, inputSpecs);
  spmd::addBucketFlags(app, options.buckets);
  spmd::addGradReduceFlag(app, options.gradReduce, "for dumps without gradient sync yet: mean (DDP) or sum");
  spmd::addDebugFlags(app, debug);

  return spmd::runTool(tool, app, argc, argv, [&] {
    spmd::DiagnosticEngine diagnostics = spmd::printingDiagnostics(tool);
    options.diagnostics = &diagnostics;
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::recordStageFlags(loaded.graph, options, spmd::Stage::Split);
    spmd::runStage(loaded, spmd::splitPipeline(options), options, debug);
    spmd::writeOutput(out, spmd::writeGraphJson(loaded.graph));
    return 0;
  });
}
