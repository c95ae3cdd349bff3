// spmd-compile: spmd-expand | spmd-split | spmd-unroll | spmd-lower in one
// process over one in-memory graph, with the stages' flags on one command
// line; the artifact is the one the shell pipeline writes from the same flags.
#include "spmd/io/folder.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/compile.h"
#include "spmd/pipelines/flags.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <utility>

namespace {

CLI::Validator isStage() {
  return CLI::Validator(
      [](const std::string& name) -> std::string {
        spmd::Stage stage;
        return spmd::parseStage(name, stage) && stage != spmd::Stage::Lower ? ""
                                                                            : "expected expand, split or unroll";
      },
      "STAGE");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tool = "spmd-compile";
  CLI::App app{"Compile a model into an artifact for spmd-run: spmd-expand, spmd-split, spmd-unroll and spmd-lower "
               "in one process."};
  app.footer("Examples:\n"
             "  spmd-compile model.pt2 --optimizer adamw --lr 3e-4 --iters 100 --device cuda -o step.spmd\n"
             "  spmd-compile samples/mlp.pt --input x:f32[100,100] --optimizer sgd --lr 0.1 --stage-dir stages -o "
             "step.spmd\n"
             "  spmd-compile model.pt2 --optimizer sgd --lr 0.1 --emit-after split -o split.json");
  std::string in = "-", out, stageDir, emitAfter;
  bool verifyEach = false;
  std::vector<std::string> inputSpecs;
  spmd::CompileOptions options;
  spmd::PipelineOptions& pipeline = options.pipeline;
  spmd::StageFlags stageFlags;
  app.add_option("IN", in, "torch.export program (.pt2), TorchScript module or JSON graph dump, '-' for stdin")
      ->capture_default_str();
  app.add_option("-o,--output", out, "artifact file to write (with --emit-after: that stage's JSON graph dump)")
      ->required();
  app.add_option("--emit-after", emitAfter, "stop after STAGE (expand, split or unroll) and write its JSON graph dump")
      ->check(isStage());
  app.add_option("--stage-dir", stageDir,
                 "also write each stage's JSON graph dump into DIR (expand.json, split.json, unroll.json: the "
                 "shell pipeline's files)");
  app.add_flag("--verify-each", verifyEach,
               "verify the graph between stages too (the passes' own checks always run)");
  app.add_flag("--eval-step", options.evalStep,
               "compile the forward-only evaluation step instead (spmd-expand --eval-step, then spmd-lower): for "
               "spmd-run --eval");
  spmd::addInputSpecFlag(app, inputSpecs);
  spmd::addStageFlags(app, pipeline, stageFlags);
  spmd::addDebugFlags(app, options.debug);
  spmd::addListPassesFlag(app);

  return spmd::runTool(tool, app, argc, argv, [&] {
    spmd::DiagnosticEngine diagnostics = spmd::printingDiagnostics(tool);
    pipeline.diagnostics = &diagnostics;
    spmd::finishStageFlags(stageFlags, pipeline, /*optimizerRequired=*/!options.evalStep);
    if (!emitAfter.empty()) spmd::parseStage(emitAfter, options.last);
    options.verifyEach = verifyEach;
    // The stages' files are written once the whole compile succeeded: a
    // failing stage leaves none of them.
    std::vector<std::pair<std::string, std::string>> files;
    options.afterStage = [&](spmd::Stage stage, const spmd::Graph& graph) {
      const bool emitted = stage == options.last;
      if (stageDir.empty() && !emitted) return;
      std::string json = spmd::writeGraphJson(graph);
      if (!stageDir.empty()) files.emplace_back(stageDir + "/" + spmd::stageName(stage) + ".json", json);
      if (emitted) files.emplace_back(out, std::move(json));
    };
    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::Artifact artifact = spmd::compileGraph(loaded, options);
    if (!stageDir.empty()) spmd::makeFolder(stageDir, "--stage-dir");
    for (const auto& [path, content] : files) spmd::writeOutput(path, content);
    if (options.last == spmd::Stage::Lower) spmd::writeArtifact(artifact, out);
    return 0;
  });
}
