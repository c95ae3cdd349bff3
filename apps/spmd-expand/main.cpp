// spmd-expand: a forward graph whose first output is the loss becomes one
// data-parallel training step (forward, backward, gradient all-reduce,
// optimizer update), written as a JSON graph dump.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/passes/derivatives.h"
#include "spmd/pipelines/flags.h"
#include "spmd/pipelines/recorded_flags.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-expand";
  CLI::App app{"Expand a forward graph (first output: the loss) into a data-parallel training step."};
  app.footer("Examples:\n"
             "  spmd-expand samples/mlp.pt --input x:f32[100,100] --optimizer adam --lr 1e-2 -o step.json\n"
             "  spmd-expand fwd.json --optimizer sgd --lr 0.1 --momentum 0.9 | spmd-split");
  std::string in = "-", out = "-";
  std::vector<std::string> inputSpecs;
  spmd::PipelineOptions options;
  spmd::OptimizerFlags optimizerFlags;
  spmd::PrecisionFlags precisionFlags;
  spmd::TrainingFlags trainingFlags;
  spmd::DebugOptions debug;
  app.add_option("IN", in, "torch.export program (.pt2), TorchScript module, JSON graph dump or listing, '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "output JSON graph dump, '-' for stdout")->capture_default_str();
  spmd::addInputSpecFlag(app, inputSpecs);
  spmd::addOptimizerFlags(app, options.optimizer, optimizerFlags);
  spmd::addGradReduceFlag(app, options.gradReduce, "mean (DDP) or sum (_spmd) over ranks");
  spmd::addPrecisionFlags(app, precisionFlags);
  spmd::addTrainingFlags(app, trainingFlags);
  bool evalStep = false;
  app.add_flag("--eval-step", evalStep,
               "write the forward-only evaluation step instead (model.eval(): BatchNorm on running statistics, dropout "
               "off, the loss the only output; spmd-lower lowers it, spmd-run --eval runs it)");
  spmd::addDebugFlags(app, debug);
  spmd::addListPassesFlag(app);
  // A callback, as --list-passes: it needs no IN, so runs before IN is looked at.
  app.add_flag_callback(
      "--list-ops",
      [] {
        for (const auto& line : spmd::derivativeSources()) std::cout << line << "\n";
        throw CLI::Success();
      },
      "list every operator of the linked LibTorch with where its derivative comes from "
      "(autograd: LibTorch's derivatives.yaml; composite: through the ops it calls; none) and exit");

  return spmd::runTool(tool, app, argc, argv, [&] {
    spmd::DiagnosticEngine diagnostics = spmd::printingDiagnostics(tool);
    options.diagnostics = &diagnostics;
    spmd::finishOptimizerFlags(optimizerFlags, options.optimizer, /*required=*/!evalStep);
    spmd::finishPrecisionFlags(precisionFlags, options);
    spmd::finishTrainingFlags(trainingFlags, options);
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::recordStageFlags(loaded.graph, options, spmd::Stage::Expand, evalStep);
    spmd::runStage(loaded, evalStep ? spmd::evalPipeline(options) : spmd::expandPipeline(options), options, debug);
    spmd::writeOutput(out, spmd::writeGraphJson(loaded.graph));
    return 0;
  });
}
